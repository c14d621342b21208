"""A full cache degrades instead of killing the job: when pinned entries (of any
process) and a reader's open set leave no room under the cap for ``room_wait_s``, the
shard is read without caching it (RAM only, the cap untouched), counted and warned about
once per process; ``on_full="raise"`` raises :class:`CacheFullError` instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

from fastload.cache import DiskTier, ShardCache
from fastload.config import CacheConfig
from fastload.errors import CacheFullError, ConfigError

from .conftest import SLACK, CountingFetch, blob, key_for
from .test_cli import run_cli

POD = Path(__file__).resolve().parent / "pod_full.py"
SIZE = 96 * 1024
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


class Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run([*UNSHARE, "true"], capture_output=True)
    return done.returncode == 0


def _capped(root: Path, shards: float) -> int:
    tier = DiskTier(root)
    cap = tier.metadata_bytes(least=True) + SLACK + int(shards * SIZE)
    tier.set_limit(cap)
    tier.close()
    return cap


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare(1) for PID namespaces")
def test_two_pods_at_a_cap_of_3_5_shards_the_reader_keeps_going_uncached(tmp_path: Path) -> None:
    root, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    cap = _capped(root, 3.5)
    pods = [
        subprocess.Popen(
            [*UNSHARE, sys.executable, str(POD), role, str(root), str(work)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("holder", "reader")
    ]
    outs = [p.communicate(timeout=180) for p in pods]
    for p, (_, err) in zip(pods, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    holder = json.loads((work / "holder.json").read_text())
    reader = json.loads((work / "reader.json").read_text())
    assert holder["pid"] == reader["pid"] == 1  # really two PID namespaces
    assert holder["intact"] == [True, True]  # A's pinned shards survive
    assert reader["right"] == [True] * 4  # B kept going, every byte right
    # shard 3 beside A's two pins and B's open shard 2 cannot fit (4 > 3.5 shards), nor
    # shard 5 beside shard 4: both read uncached; 2 and 4 cached
    assert reader["cached"] == [True, False, True, False]
    assert reader["uncached_reads"] == 2
    assert len(reader["warnings"]) == 1
    assert "without caching" in reader["warnings"][0]
    assert max(reader["du"]) <= cap, (reader["du"], cap)
    fetches = Counter(line.split()[0] for line in (work / "fetches").read_text().splitlines())
    assert fetches == Counter({f"shard-{i:06d}.tar": 1 for i in range(6)})
    after = DiskTier(root)
    assert after.verify() == []
    after.close()
    code, out = run_cli(["stats", "--cache-dir", str(root), "--json"])
    assert code == 0
    assert json.loads(out)["counters"]["uncached_reads"] == 2  # summed over the pods


def test_on_full_raise_raises_and_stream_reads_uncached_in_one_process(cache_dir: Path) -> None:
    cap = _capped(cache_dir, 1.5)
    del cap
    a, b = blob(1, SIZE), blob(2, SIZE)
    strict = ShardCache(cache_dir, room_wait_s=0.1, on_full="raise")
    held = strict.open_shard("ds", Info("a", a), CountingFetch(a))
    with pytest.raises(CacheFullError, match="no room"):
        strict.open_shard("ds", Info("b", b), CountingFetch(b))
    lenient = ShardCache(cache_dir, room_wait_s=0.1)
    fetch_b = CountingFetch(b)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = lenient.open_shard("ds", Info("b", b), fetch_b)
        again = lenient.open_shard("ds", Info("b", b), fetch_b)
    assert bytes(got.data) == b
    assert got.path is None
    assert bytes(again.data) == b
    assert fetch_b.calls == 2
    assert lenient.disk is not None
    assert lenient.disk.counters().uncached_reads == 2
    assert len([w for w in caught if w.category is RuntimeWarning]) <= 1
    assert bytes(held.data) == a  # the pinned entry stayed
    for s in (got, again, held):
        s.close()
    strict.close()
    lenient.close()


def test_cache_config_checks_on_full_and_lease() -> None:
    assert CacheConfig().on_full == "stream"
    with pytest.raises(ConfigError, match="on_full"):
        CacheConfig(on_full="drop")
    with pytest.raises(ConfigError, match="lease_s"):
        CacheConfig(lease_s=0)
    with pytest.raises(ConfigError, match="on_full"):
        ShardCache(on_full="nope")
