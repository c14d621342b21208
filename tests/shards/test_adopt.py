"""``fastload manifest`` / ``fastload.write_manifest``: shards written by
``webdataset.ShardWriter`` (plain and gzipped, named by a brace pattern) become a
fastload dataset that reads sample-for-sample like ``webdataset.WebDataset``."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds

import fastload
from fastload.cli import manifest as manifest_cli
from fastload.errors import ConfigError, IntegrityError, OutputExistsError, ShardFormatError
from fastload.shards.adopt import expand_braces, find_shards
from fastload.shards.gzipped import decompress_stream
from fastload.shards.manifest import Manifest


def write_wds(root: Path, pattern: str, n: int, maxcount: int, seed: int = 0) -> list[str]:
    """``n`` samples through webdataset's ShardWriter; returns the shard paths."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    with wds.ShardWriter(str(root / pattern), maxcount=maxcount, verbose=0) as sink:
        for i in range(n):
            size = int(rng.integers(1, 3000))
            sink.write(
                {
                    "__key__": f"s{i:05d}",
                    "jpg": rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
                    "cls": str(i % 7),
                    "json": json.dumps({"i": i}),
                }
            )
        paths = [str(root / (pattern % k)) for k in range(sink.shard)]
    return [p for p in paths if os.path.exists(p)]


def wds_samples(urls: str) -> list[dict[str, Any]]:
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in ds]


def fastload_samples(url: str) -> list[dict[str, Any]]:
    ds = fastload.ShardedDataset(url)
    try:
        return [ds[i] for i in range(len(ds))]
    finally:
        ds.close()


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_webdataset_shards_adopted_read_like_webdataset(tmp_path: Path, suffix: str) -> None:
    paths = write_wds(tmp_path / "wds", f"train-%06d{suffix}", n=57, maxcount=10)
    assert len(paths) == 6
    pattern = str(tmp_path / "wds" / f"train-{{000000..000005}}{suffix}")
    manifest = fastload.write_manifest(pattern)
    assert manifest.num_samples == 57
    assert set(manifest.fields) == {"jpg", "cls", "json"}
    assert [s.name for s in manifest.shards] == [os.path.basename(p) for p in paths]
    if suffix == ".tar.gz":
        for s, p in zip(manifest.shards, paths, strict=True):
            assert s.compression == "gzip"
            assert s.compressed_bytes == os.path.getsize(p)
            assert s.bytes == len(gzip.decompress(Path(p).read_bytes()))
    # manifest round-trips with the compressed fields
    assert Manifest.load(str(tmp_path / "wds")).shards == manifest.shards

    want = wds_samples(pattern)
    got = fastload_samples(str(tmp_path / "wds"))
    assert len(got) == len(want) == 57
    for g, w in zip(got, want, strict=True):
        assert g["__key__"] == w["__key__"]
        assert {k: v for k, v in g.items() if k != "__key__"} == {
            k: v for k, v in w.items() if k != "__key__"
        }


def test_gzipped_shards_stream_through_the_disk_cache(tmp_path: Path) -> None:
    write_wds(tmp_path / "wds", "part-%06d.tgz", n=30, maxcount=8, seed=2)
    manifest = fastload.write_manifest(str(tmp_path / "wds"))  # a prefix
    assert len(manifest.shards) == 4
    assert all(s.compression for s in manifest.shards)
    cache = tmp_path / "cache"
    ds = fastload.StreamingDataset(str(tmp_path / "wds"), cache_dir=str(cache))
    try:
        first = list(ds)
        second = list(ds)
    finally:
        ds.close()
    assert len(first) == 30
    assert first == second
    # the cache holds the decompressed tars, each exactly once
    cached = sorted(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(cache)
        for f in fs
        if os.path.getsize(os.path.join(d, f)) in {s.bytes for s in manifest.shards}
    )
    assert cached == sorted(s.bytes for s in manifest.shards)


def test_s3_brace_pattern_and_cli(
    tmp_path: Path, s3_url: str, seaweed: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastload.storage import open_store

    opts = seaweed.storage_options
    paths = write_wds(tmp_path / "wds", "x-%03d.tar.gz", n=25, maxcount=10, seed=3)
    store = open_store(s3_url, opts)
    for p in paths:
        store.write_bytes("shards/" + os.path.basename(p), Path(p).read_bytes())
    parser = argparse.ArgumentParser(prog="fastload")
    manifest_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "manifest",
            f"{s3_url}/shards/x-{{000..002}}.tar.gz",
            "--out",
            s3_url,
            "--storage-options",
            json.dumps(opts),
            "--json",
        ]
    )
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shards"] == 3 == doc["gzipped"]
    assert doc["samples"] == 25
    m = Manifest.load(s3_url, opts)
    assert [s.name for s in m.shards] == [f"shards/x-{k:03d}.tar.gz" for k in range(3)]
    assert store.exists("shards/x-000.tar.gz.idx")
    ds = fastload.ShardedDataset(s3_url, storage_options=opts, cache_dir=str(tmp_path / "c"))
    try:
        got = [ds[i] for i in range(len(ds))]
    finally:
        ds.close()
    want = wds_samples(str(tmp_path / "wds" / "x-{000..002}.tar.gz"))
    assert [g["__key__"] for g in got] == [w["__key__"] for w in want]
    assert [g["jpg"] for g in got] == [w["jpg"] for w in want]


def test_refusals(tmp_path: Path) -> None:
    write_wds(tmp_path / "wds", "t-%02d.tar", n=5, maxcount=10)
    with pytest.raises(ConfigError, match="no shards found"):
        fastload.write_manifest(str(tmp_path / "wds" / "nothing-*.tar"))
    with pytest.raises(ConfigError, match="does not exist"):
        fastload.write_manifest(str(tmp_path / "wds" / "t-{00..01}.tar"))
    with pytest.raises(ConfigError, match="directory above it"):
        fastload.write_manifest(str(tmp_path / "wds" / "t-*.tar"), out=str(tmp_path / "else"))
    fastload.write_manifest(str(tmp_path / "wds" / "t-*.tar"))
    with pytest.raises(OutputExistsError):
        fastload.write_manifest(str(tmp_path / "wds" / "t-*.tar"))
    fastload.write_manifest(str(tmp_path / "wds" / "t-*.tar"), overwrite=True)
    # a corrupt shard is named, and no manifest is written for it
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.tar").write_bytes(b"\x01" * 1024)
    with pytest.raises(ShardFormatError, match="a.tar"):
        fastload.write_manifest(str(bad))
    assert not (bad / "manifest.json").exists()
    (bad / "a.tar").unlink()
    (bad / "b.tar.gz").write_bytes(gzip.compress(b"x" * 5000)[:-20])
    with pytest.raises(ShardFormatError, match=r"b\.tar\.gz.*ends early"):
        fastload.write_manifest(str(bad))


def test_gzip_shard_that_changed_after_adoption_is_refused(tmp_path: Path) -> None:
    paths = write_wds(tmp_path / "wds", "g-%02d.tar.gz", n=6, maxcount=10)
    fastload.write_manifest(str(tmp_path / "wds"))
    # replace the object with another gzip of different content and size
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("z.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    Path(paths[0]).write_bytes(gzip.compress(buf.getvalue()))
    ds = fastload.ShardedDataset(str(tmp_path / "wds"), cache_dir=str(tmp_path / "c"))
    try:
        with pytest.raises((IntegrityError, fastload.CacheError), match="g-00.tar.gz"):
            ds[0]
    finally:
        ds.close()


def test_expand_braces_like_braceexpand() -> None:
    braceexpand = pytest.importorskip("braceexpand").braceexpand
    for pattern in ["a-{000..012}.tar", "{a,b}/x-{0..3}.tgz", "p{9..11}q", "no-pattern.tar"]:
        assert expand_braces(pattern) == list(braceexpand(pattern))


def test_find_shards_kinds(tmp_path: Path) -> None:
    write_wds(tmp_path / "d", "s-%02d.tar", n=25, maxcount=10)
    (tmp_path / "d" / "notes.txt").write_text("x")
    assert find_shards(str(tmp_path / "d")) == (
        str(tmp_path / "d"),
        ["s-00.tar", "s-01.tar", "s-02.tar"],
    )
    assert find_shards(str(tmp_path / "d" / "s-0[12].tar"))[1] == ["s-01.tar", "s-02.tar"]


def test_decompress_concatenated_members() -> None:
    out = io.BytesIO()
    data = gzip.compress(b"abc" * 1000) + gzip.compress(b"def")
    seen = decompress_stream(iter([data[:7], data[7:]]), out.write, "x")
    assert out.getvalue() == b"abc" * 1000 + b"def"
    assert seen.bytes == 3003
    assert seen.compressed_bytes == len(data)
