"""No stopped process stalls the node. A downloader stopped with SIGSTOP in the middle
of a shard (a debugger, a frozen container) keeps its entry lock, but its heartbeat
stops: another process wanting the shard reads it uncached after ``lease_s``, every byte
right, and the stopped one, once continued, publishes it as usual, counted once. A
process stopped inside a catalog read transaction holds the WAL; the others go on, and
the cap holds (writes pay for the WAL's growth by evicting)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from fastload.cache import DiskTier, ShardCache
from fastload.cache.catalog import WAL_LIMIT
from fastload.shards.checksum import xxh3_128
from fastload.storage import open_store

from .conftest import CountingFetch, blob, capped_tier, key_for, temp_files

CHILD = Path(__file__).resolve().parent / "stopped_child.py"
SIZE = 1 << 20
LEASE_S = 2.0


class Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def _spawn(root: Path, url: str, options: dict, checksum: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(root),
            url,
            json.dumps(options),
            "s.tar",
            str(SIZE),
            checksum,
            str(out),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_mid_shard(root: Path, proxy: Any, child: subprocess.Popen) -> None:
    """Wait until ``child`` has its part file and the proxy has sent it some of the
    shard's body, but not all of it."""
    deadline = time.monotonic() + 180.0
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise AssertionError(f"the first download ended: {child.stderr.read()}")
        sent = proxy.stats.body_bytes_to_client
        if list((root / "tmp").glob("*.part")) and 64 * 1024 <= sent < SIZE // 2:
            return
        time.sleep(0.02)
    raise AssertionError(f"the first download never started ({proxy.stats})")


@pytest.mark.slow
def test_a_downloader_stopped_mid_shard_is_bypassed_and_finishes_right(
    fault_proxy, s3_url: str, tmp_path: Path
) -> None:
    data = blob(77, SIZE)
    options = fault_proxy.storage_options
    store = open_store(s3_url, options)
    store.write_bytes("s.tar", data)
    checksum = xxh3_128(data)
    root = tmp_path / "cache"
    DiskTier(root).close()
    fault_proxy.body_rate = 128 * 1024  # the shard takes 8 s to arrive
    first = _spawn(root, s3_url, options, checksum, tmp_path / "first.json")
    try:
        _wait_mid_shard(root, fault_proxy, first)
        os.kill(first.pid, signal.SIGSTOP)
        fault_proxy.body_rate = None
        second = _spawn(root, s3_url, options, checksum, tmp_path / "second.json")
        # the second is done while the first is still stopped
        assert second.wait(120) == 0, second.stderr.read() if second.stderr else ""
        assert first.poll() is None
        got = json.loads((tmp_path / "second.json").read_text())
        assert got["right"] is True
        assert got["cached"] is False
        assert got["lease_bypasses"] == 1
        assert got["fetches"] == 0
        # the documented deadline: lease_s plus a look every 0.25 s (and start-up)
        assert got["took_s"] < LEASE_S + 10
        # a later reader, with the holder's lease run out, is bypassed as well
        third = _spawn(root, s3_url, options, checksum, tmp_path / "third.json")
        assert third.wait(120) == 0, third.stderr.read() if third.stderr else ""
        later = json.loads((tmp_path / "third.json").read_text())
        assert later["right"] is True
        assert later["lease_bypasses"] == 1
        assert first.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first.pid, signal.SIGCONT)
    assert first.wait(120) == 0, first.stderr.read() if first.stderr else ""
    mine = json.loads((tmp_path / "first.json").read_text())
    assert mine["right"] is True
    assert mine["cached"] is True
    assert mine["fetches"] == 1
    tier = DiskTier(root)
    assert tier.verify() == []
    assert temp_files(root) == []
    counters = tier.lifetime_counters()
    assert counters["fetches"] == 1
    assert counters["bytes_fetched"] == SIZE
    assert counters["lease_bypasses"] == 2
    [entry] = tier.entries()
    assert entry.state.name == "READY"
    assert entry.size == SIZE
    assert tier.usage()["data"] == SIZE
    tier.close()


def test_a_process_stopped_in_a_catalog_read_leaves_the_others_going(cache_dir: Path) -> None:
    entries = [blob(i, 32 * 1024) for i in range(24)]
    tier = capped_tier(cache_dir, data_room=len(entries) * 32 * 1024)
    cap = tier.limit
    assert cap is not None
    for i, data in enumerate(entries):
        tier.get(key_for(data, f"s{i}.tar"), len(data), CountingFetch(data))
    code = (
        "import sys, time\n"
        "from fastload.cache import DiskTier\n"
        f"t = DiskTier({str(cache_dir)!r}, sweep=False)\n"
        "with t.catalog.read() as conn:\n"
        "    conn.execute('SELECT count(*) FROM entries').fetchone()\n"
        "    print('reading', flush=True)\n"
        "    time.sleep(600)\n"
    )
    reader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline() == "reading\n"
        os.kill(reader.pid, signal.SIGSTOP)
        for i in range(80):
            small = blob(500 + i, 4096)
            got = tier.get(key_for(small, f"new-{i}.tar"), len(small), CountingFetch(small))
            assert got.read_bytes() == small
            assert tier.usage()["total"] <= cap  # type: ignore[operator]
            if tier.catalog.wal_bytes() > WAL_LIMIT + 128 * 1024:
                break
        assert tier.catalog.wal_bytes() > WAL_LIMIT  # the stopped reader did hold it
        assert tier.stats().evictions > 0  # paid for with entries, the cap kept
    finally:
        os.kill(reader.pid, signal.SIGKILL)
        os.kill(reader.pid, signal.SIGCONT)
        reader.wait(30)
    tier.close()
    after = DiskTier(cache_dir)
    assert after.catalog.shrink_wal() is True  # bounded again once it is gone
    assert after.catalog.wal_bytes() == 0
    assert after.verify() == []
    after.close()


def test_a_process_stopped_inside_a_catalog_write_stalls_nobody_past_the_lease(
    cache_dir: Path,
) -> None:
    old, new = blob(30, 20000), blob(31, 20000)
    first = ShardCache(cache_dir)
    first.open_shard("ds", Info("old.tar", old), CountingFetch(old)).close()
    first.close()
    code = (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({str(cache_dir / 'catalog.sqlite')!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('writing', flush=True)\n"
        "time.sleep(600)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "writing\n"
        os.kill(writer.pid, signal.SIGSTOP)
        cache = ShardCache(cache_dir, lease_s=1.0)  # constructing it writes nothing
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            hit = cache.open_shard("ds", Info("old.tar", old), CountingFetch(old))
            fetch = CountingFetch(new)
            got = cache.open_shard("ds", Info("new.tar", new), fetch)
        assert bytes(hit.data) == old
        assert hit.path is not None  # a hit needs no write
        assert bytes(got.data) == new
        assert got.path is None  # no room could be reserved: read uncached
        assert fetch.calls == 1
        assert cache.disk is not None
        assert cache.disk.counters().lease_bypasses == 1
        hit.close()
        got.close()
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        os.kill(writer.pid, signal.SIGCONT)
        writer.wait(30)
    # the writer gone, the catalog is writable again: the shard is cached now
    again = cache.open_shard("ds", Info("new.tar", new), CountingFetch(new))
    assert again.path is not None
    assert bytes(again.data) == new
    again.close()
    cache.close()
    assert DiskTier(cache_dir).verify() == []
