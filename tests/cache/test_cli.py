"""``fastload cache stats|verify|clear|warm`` on real cache dirs and a file:// dataset."""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from fastload.cache import DiskTier, EntryKey
from fastload.cli import cache as cache_cli
from fastload.errors import FastloadError
from fastload.shards.checksum import xxh3_128
from fastload.shards.manifest import Manifest, ShardInfo

from .conftest import CountingFetch, blob, key_for


def run_cli(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``fastload cache ...`` like ``fastload.cli.main`` does, capturing stdout.

    Only the cache subcommand is registered, so this does not depend on the other
    subcommands' modules."""
    parser = argparse.ArgumentParser(prog="fastload")
    cache_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cache", *argv])
    out = io.StringIO()
    with redirect_stdout(out):
        try:
            code = int(args.func(args))
        except FastloadError as exc:
            print(f"error: {exc}")
            code = 1
    return code, out.getvalue()


def make_dataset(root: Path, shards: int = 3, per_shard: int = 4) -> Manifest:
    """Write tar shards, opaque sidecars and manifest.json under ``root``."""
    root.mkdir(parents=True)
    infos = []
    for s in range(shards):
        name = f"shard-{s:06d}.tar"
        with tarfile.open(root / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(per_shard):
                payload = blob(s * 100 + k, 3000)
                member = tarfile.TarInfo(f"{s:03d}{k:04d}.bin")
                member.size = len(payload)
                tar.addfile(member, io.BytesIO(payload))
        data = (root / name).read_bytes()
        # the cache treats sidecars as opaque bytes, so any content serves here
        idx = blob(9000 + s, 200)
        (root / f"{name}.idx").write_bytes(idx)
        infos.append(
            ShardInfo(
                name, len(data), per_shard, xxh3_128(data), f"{name}.idx", len(idx), xxh3_128(idx)
            )
        )
    manifest = Manifest.build(infos, ["bin"], {"kind": "generic"}, url=root.as_uri())
    (root / "manifest.json").write_text(manifest.to_json())
    return manifest


def test_warm_stages_every_shard_and_index_then_is_a_no_op(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path / "ds")
    cache_dir = tmp_path / "cache"
    url = (tmp_path / "ds").as_uri()
    code, out = run_cli(["warm", url, "--cache-dir", str(cache_dir), "--json"])
    assert code == 0, out
    doc = json.loads(out)
    expected = sum(s.bytes + s.index_bytes for s in manifest.shards)
    assert (doc["version"], doc["shards"], doc["objects"]) == (1, 3, 6)
    assert doc["bytes_fetched"] == doc["bytes"] == expected
    tier = DiskTier(cache_dir)
    assert len(tier.entries()) == 6
    for s in manifest.shards:
        key = EntryKey(url, s.name, s.checksum)
        assert tier.contains(key)
        assert tier.path_for(key).read_bytes() == (tmp_path / "ds" / s.name).read_bytes()
    code, out = run_cli(["warm", url, "--cache-dir", str(cache_dir), "--json"])
    assert code == 0
    assert json.loads(out)["bytes_fetched"] == 0


def test_warm_refuses_a_dataset_bigger_than_the_cap(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds")
    code, out = run_cli(
        [
            "warm",
            (tmp_path / "ds").as_uri(),
            "--cache-dir",
            str(tmp_path / "c"),
            "--cache-limit",
            "1KB",
        ]
    )
    assert code == 1
    assert "cache limit" in out


def test_stats_verify_clear(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir)
    datas = [blob(i, 1000 + i) for i in range(3)]
    paths = [
        tier.get(key_for(d, f"shard-{i:06d}.tar"), len(d), CountingFetch(d))
        for i, d in enumerate(datas)
    ]
    code, out = run_cli(["stats", "--cache-dir", str(cache_dir), "--json"])
    assert code == 0
    doc = json.loads(out)
    assert (doc["entries"], doc["bytes_used"]) == (3, sum(map(len, datas)))
    assert doc["counters"]["fetches"] == 3
    assert doc["states"] == {"READY": 3}
    code, text = run_cli(["stats", "--cache-dir", str(cache_dir)])
    assert code == 0
    assert "entries     3" in text

    assert run_cli(["verify", "--cache-dir", str(cache_dir)])[0] == 0
    raw = bytearray(paths[1].read_bytes())
    raw[0] ^= 0xFF
    paths[1].write_bytes(bytes(raw))
    code, out = run_cli(["verify", "--cache-dir", str(cache_dir), "--json"])
    assert code == 1
    assert [b["shard"] for b in json.loads(out)["bad"]] == ["shard-000001.tar"]
    code, out = run_cli(["verify", "--repair", "--cache-dir", str(cache_dir)])
    assert code == 1
    assert "dropped 1 bad" in out
    assert run_cli(["verify", "--cache-dir", str(cache_dir)])[0] == 0

    code, out = run_cli(["clear", "--cache-dir", str(cache_dir), "--json"])
    assert code == 0
    assert json.loads(out)["removed"] == 2
    assert DiskTier(cache_dir).entries() == []


def test_actions_on_a_missing_cache_dir_fail_clearly(tmp_path: Path) -> None:
    code, out = run_cli(["stats", "--cache-dir", str(tmp_path / "nope")])
    assert code == 1
    assert "no fastload cache at" in out
    assert not (tmp_path / "nope").exists()


def test_default_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", "/nvme/fl")
    assert cache_cli.default_cache_dir() == "/nvme/fl"
    monkeypatch.delenv("FASTLOAD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert cache_cli.default_cache_dir() == "/x/fastload"


def test_stats_shows_the_stored_cap_and_what_it_counts(cache_dir: Path) -> None:
    DiskTier(cache_dir, cache_limit="5MB").close()
    code, out = run_cli(["stats", "--cache-dir", str(cache_dir), "--json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["cache_limit"] == 5_000_000  # stored in the directory by the first tier
    assert 0 < doc["metadata_bytes"] <= doc["disk_bytes"] <= doc["cache_limit"]
    code, text = run_cli(["stats", "--cache-dir", str(cache_dir)])
    assert "cache limit 5.00 MB" in text


def test_verify_reports_leftovers_before_repair_removes_them(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir)
    data = blob(5, 3000)
    key = key_for(data)
    tier.get(key, len(data), CountingFetch(data))
    tier.close()
    part = cache_dir / "tmp" / f"{key.flat}.999.dead.part"
    part.write_bytes(b"partial")  # what a SIGKILLed download leaves
    orphan = cache_dir / "data" / "0123456789abcdef" / "ab-shard.tar"
    orphan.parent.mkdir()
    orphan.write_bytes(b"no row")
    code, out = run_cli(["verify", "--cache-dir", str(cache_dir), "--json"])
    assert code == 0
    found = json.loads(out)["leftovers"]
    assert found["temp_files"] == [f"tmp/{part.name}"]
    assert found["orphan_files"] == ["data/0123456789abcdef/ab-shard.tar"]
    assert part.exists()  # reported, not silently removed
    assert orphan.exists()
    code, out = run_cli(["verify", "--repair", "--cache-dir", str(cache_dir)])
    assert code == 0
    assert "2 leftover(s) removed" in out
    assert not part.exists()
    assert not orphan.exists()
    assert DiskTier(cache_dir).verify() == []
