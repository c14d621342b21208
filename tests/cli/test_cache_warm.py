"""``fastload cache warm`` over gzipped shards, on a real SeaweedFS: warm stages what the
datasets read (the decompressed, verified tars under the keys the datasets look up),
so a read after it fetches nothing."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.cache import DiskTier, EntryKey
from fastload.cli import main
from fastload.storage import open_store


def _payload(i: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return seed * (20 + i % 50)


def _write_gzipped(url: str, options: dict[str, Any], shards: int = 3, per: int = 6) -> dict:
    """Gzipped tar shards ``part-00K.tar.gz`` at ``url``; returns ``{key: bin bytes}``."""
    store = open_store(url, options)
    expected: dict[str, bytes] = {}
    for k in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(k * per, (k + 1) * per):
                key = f"s{i:05d}"
                for field, data in (("bin", _payload(i)), ("cls", str(i % 7).encode())):
                    member = tarfile.TarInfo(f"{key}.{field}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
                expected[key] = _payload(i)
        store.write_bytes(f"part-{k:03d}.tar.gz", gzip.compress(buf.getvalue()))
    return expected


def _warm(url: str, cache: Path, options_file: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    argv = ["cache", "warm", url, "--cache-dir", str(cache), "--json"]
    code = main([*argv, "--storage-options", f"@{options_file}"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return dict(json.loads(out.out))


@pytest.mark.s3
def test_warm_stages_gzipped_shards_as_the_datasets_read_them(
    seaweed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = seaweed.new_url("gz")
    opts = seaweed.storage_options
    expected = _write_gzipped(url, opts)
    manifest = fastload.write_manifest(url, storage_options=opts)
    assert [s.compression for s in manifest.shards] == ["gzip"] * 3
    options_file = tmp_path / "options.json"
    options_file.write_text(json.dumps(opts))
    os.chmod(options_file, 0o600)
    cache = tmp_path / "cache"

    doc = _warm(url, cache, options_file, capsys)
    # the decompressed tars and their sidecars, nothing else
    staged = sum(s.bytes + s.index_bytes for s in manifest.shards)
    assert doc["bytes"] == doc["bytes_fetched"] == staged
    tier = DiskTier(cache)
    try:
        assert len(tier.entries()) == 2 * len(manifest.shards)
        for s in manifest.shards:
            # the entry is the tar the manifest's size and checksum describe
            path = tier.path_for(EntryKey(url, s.name, s.checksum))
            assert path.stat().st_size == s.bytes != s.compressed_bytes
            with tarfile.open(path) as tar:
                assert tar.getnames()[0].startswith("s")
        assert tier.verify() == []
        lifetime = tier.lifetime_counters()  # summed over every process of the directory
    finally:
        tier.close()

    ds = fastload.StreamingDataset(url, cache_dir=cache, storage_options=opts)
    try:
        got = {s["__key__"]: s["bin"] for s in ds}
        stats = ds.io_stats()
    finally:
        ds.close()
    assert got == expected
    # every shard and index a hit: nothing read from the store, nothing fetched
    assert stats["remote_bytes"] == 0
    assert stats["cache_misses"] == 0
    assert stats["cache_hits"] == 2 * len(manifest.shards)
    tier = DiskTier(cache)
    try:
        after = tier.lifetime_counters()
    finally:
        tier.close()
    assert lifetime["bytes_fetched"] == staged
    assert after["bytes_fetched"] == lifetime["bytes_fetched"]
    assert after["fetches"] == lifetime["fetches"] == 2 * len(manifest.shards)
    assert after["misses"] == lifetime["misses"]
    # warming again is a no-op
    assert _warm(url, cache, options_file, capsys)["bytes_fetched"] == 0
