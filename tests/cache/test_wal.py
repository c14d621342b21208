"""The catalog's write-ahead log under the cap: it is shrunk although other processes
checkpoint all the time, and a reader that holds it open makes writes evict for it
instead of growing the cache past its cap."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastload.cache import DiskTier
from fastload.cache.catalog import WAL_LIMIT
from fastload.errors import CacheFullError

from .conftest import CountingFetch, blob, capped_tier, key_for

#: sqlite's unix VFS takes its WAL locks on bytes 120 + i of the ``-shm`` file; lock 1
#: is the checkpointer's (``WAL_CKPT_LOCK``), which a checkpoint takes without its busy
#: handler: a second checkpoint meanwhile fails at once
_CKPT_LOCK_BYTE = 121


def _disk_bytes(root: Path) -> int:
    """What ``du`` counts under ``root``: allocated blocks of every file and directory."""
    total = os.lstat(root).st_blocks * 512
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _grow_wal(tier: DiskTier, n: int) -> None:
    for i in range(n):
        data = blob(900 + i, 4096)
        tier.get(key_for(data, f"grow-{i}.tar"), len(data), CountingFetch(data))


def test_the_wal_is_shrunk_while_another_process_is_checkpointing(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir)
    _grow_wal(tier, 8)
    assert tier.catalog.wal_bytes() > 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import fcntl, os, sys, time
                fd = os.open({str(cache_dir / "catalog.sqlite-shm")!r}, os.O_RDWR)
                fcntl.lockf(fd, fcntl.LOCK_EX, 1, {_CKPT_LOCK_BYTE})
                print("held", flush=True)
                time.sleep(0.3)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        # a single try answers SQLITE_BUSY at once here; the shrink tries again
        done = tier.catalog.shrink_wal(timeout_s=10.0)
        assert tier.catalog.wal_bytes() == 0
        assert done is True
    finally:
        holder.wait(30)
    tier.close()


def test_a_reader_holding_the_wal_makes_writes_evict_instead_of_breaking_the_cap(
    cache_dir: Path,
) -> None:
    entries = [blob(i, 32 * 1024) for i in range(40)]
    tier = capped_tier(cache_dir, data_room=len(entries) * 32 * 1024)
    cap = tier.limit
    assert cap is not None
    for i, data in enumerate(entries):
        tier.get(key_for(data, f"s{i}.tar"), len(data), CountingFetch(data))
    assert tier.stats().evictions == 0
    # another connection in a read transaction that began with frames in the WAL:
    # no checkpoint can reset the WAL under it, so every write makes it longer
    reader = sqlite3.connect(cache_dir / "catalog.sqlite", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM entries").fetchone()
    worst = 0
    try:
        for i in range(60):
            # each new entry writes its reservation and its publication
            small = blob(500 + i, 4096)
            tier.get(key_for(small, f"new-{i}.tar"), len(small), CountingFetch(small))
            worst = max(worst, _disk_bytes(cache_dir))
            assert tier.usage()["total"] <= cap  # type: ignore[operator]
            if tier.catalog.wal_bytes() > WAL_LIMIT + 128 * 1024:
                break
        assert tier.catalog.wal_bytes() > WAL_LIMIT  # the reader did hold it
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert worst <= cap, (worst, cap)
    assert tier.stats().evictions > 0  # the WAL was paid for with entries
    tier.close()
    after = DiskTier(cache_dir)  # (this tier's own shrinks pause a second after one failed)
    assert after.catalog.shrink_wal() is True
    assert after.catalog.wal_bytes() == 0
    assert after.verify() == []
    after.close()


def test_after_a_shrink_that_timed_out_the_next_second_tries_none(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir)
    _grow_wal(tier, 8)
    reader = sqlite3.connect(cache_dir / "catalog.sqlite", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM entries").fetchone()
    try:
        assert tier.catalog.shrink_wal(timeout_s=0.05) is False  # the reader holds it
    finally:
        reader.execute("COMMIT")
        reader.close()
    # the reader is gone, but this catalog does not try again within the second: a
    # reader that holds the WAL would otherwise stall every write by the timeout
    assert tier.catalog.shrink_wal(timeout_s=10.0) is False
    assert tier.catalog.wal_bytes() > 0
    tier.close()
    after = DiskTier(cache_dir)
    assert after.catalog.shrink_wal() is True
    after.close()


def test_a_fetch_with_no_room_left_beside_a_held_wal_says_so(cache_dir: Path) -> None:
    tier = capped_tier(cache_dir, data_room=2 * 32 * 1024, room_wait_s=0.2)
    reader = sqlite3.connect(cache_dir / "catalog.sqlite", isolation_level=None)
    _grow_wal(tier, 1)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM entries").fetchone()

    def fill() -> None:
        for i in range(400):  # each fetch writes to the held WAL until none fits
            data = blob(700 + i, 32 * 1024)
            tier.get(key_for(data, f"full-{i}.tar"), len(data), CountingFetch(data))

    try:
        with pytest.raises(CacheFullError, match="its WAL has grown to .* keeps a catalog read"):
            fill()
    finally:
        reader.execute("COMMIT")
        reader.close()
    tier.close()
