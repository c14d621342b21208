"""Fork during a download: the child must not keep the entry locked (nor pinned).

A DataLoader worker forked while its parent downloads inherits the open lock file; a
flock belongs to the open file, so without care the child holds the lock for its
whole life and every other process waits out its deadline. Here the child lives on
(sleeping) long after the parent has published: another process must get the entry
while the child is still alive, well inside a wait deadline shorter than the child's
life.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

from fastload.cache import DiskTier

from .conftest import CountingFetch, blob, key_for

DATA = blob(77, 300_000)
KEY = key_for(DATA)


def _sleeper() -> None:
    time.sleep(120)
    os._exit(0)


def _other(root: str, out: str) -> None:
    tier = DiskTier(root, wait_deadline_s=30.0)
    got = tier.get(KEY, len(DATA), CountingFetch(b"wrong bytes: must not be fetched"))
    Path(out).write_bytes(got.read_bytes())
    os._exit(0)


def test_child_forked_during_a_download_does_not_hold_the_entry(
    cache_dir: Path, tmp_path: Path
) -> None:
    tier = DiskTier(cache_dir)
    ctx = mp.get_context("fork")
    forked: list[mp.process.BaseProcess] = []
    in_fetch = threading.Event()

    def fetch(f: BinaryIO) -> None:
        f.write(DATA[:1000])
        # a worker is forked right now, while this download holds the entry lock
        child = ctx.Process(target=_sleeper)
        child.start()
        forked.append(child)
        in_fetch.set()
        f.write(DATA[1000:])

    try:
        # (the fork happens on this, the main thread: the child inherits the lock fd)
        assert tier.get(KEY, len(DATA), fetch).read_bytes() == DATA
        assert in_fetch.is_set()
        other = ctx.Process(target=_other, args=(str(cache_dir), str(tmp_path / "out")))
        other.start()
        other.join(60)
        assert forked[0].is_alive()  # the forked child still lives...
        assert other.exitcode == 0  # ...and did not keep the other process waiting
        assert (tmp_path / "out").read_bytes() == DATA
        # nor does the child hold the entry pinned: it can be evicted
        assert tier.clear() == (1, len(DATA))
    finally:
        for c in forked:
            c.kill()
            c.join(10)


def _blocked_getter(root: str, out: str) -> None:
    tier = DiskTier(root, wait_deadline_s=60.0)
    path = tier.get(KEY, len(DATA), CountingFetch(b"not this"))
    Path(out).write_text(f"{path.read_bytes() == DATA} {tier.counters().waits}")
    os._exit(0)


def test_a_waiting_process_wakes_on_release_and_counts_one_wait(
    cache_dir: Path, tmp_path: Path
) -> None:
    """The waiter blocks in flock (no polling): it finds the entry READY right after
    the holder releases, having waited once."""
    tier = DiskTier(cache_dir)
    ctx = mp.get_context("fork")
    release = threading.Event()
    waiter: list[mp.process.BaseProcess] = []

    def fetch(f: BinaryIO) -> None:
        f.write(DATA)
        p = ctx.Process(target=_blocked_getter, args=(str(cache_dir), str(tmp_path / "w")))
        p.start()
        waiter.append(p)
        release.wait(0.5)  # let it reach the lock (not asserted on)

    tier.get(KEY, len(DATA), fetch)
    waiter[0].join(60)
    assert waiter[0].exitcode == 0
    assert (tmp_path / "w").read_text() == "True 1"


def test_a_child_forked_while_another_thread_writes_the_catalog_can_write_it(
    tmp_path: Path,
) -> None:
    """sqlite keeps its lock bookkeeping per process: a child forked while another
    thread of the parent is inside a write transaction inherits that bookkeeping with
    nobody left to release it, and its own connection was refused the write lock
    until busy_timeout ("database is locked" in a DataLoader worker: the flake of the
    no-cache_dir transport tests). The fork now waits for the transaction to end."""
    from fastload.cache.catalog import Catalog

    path = tmp_path / "catalog.sqlite"
    cat = Catalog(path, busy_timeout_s=3.0)
    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with cat.txn():
            inside.set()
            release.wait(timeout=5.0)

    th = threading.Thread(target=writer)
    th.start()
    assert inside.wait(timeout=5.0)
    timer = threading.Timer(0.3, release.set)  # the transaction ends while fork waits
    timer.start()
    pid = os.fork()
    if pid == 0:  # the child: its own catalog must take the write lock at once
        code = 3
        try:
            with Catalog(path, busy_timeout_s=3.0).txn():
                pass
            code = 0
        finally:
            os._exit(code)
    # fork() returned only once the transaction had ended, so after its release
    released_before_fork_returned = release.is_set()
    th.join(timeout=10.0)
    timer.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not write the catalog"
    assert released_before_fork_returned
