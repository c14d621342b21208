"""A cancelled download (KeyboardInterrupt, SystemExit, CancelledError) is not a
failure: the entry goes back to ABSENT, so a request waiting for it fetches it itself
and gets the bytes; only real errors are recorded as FAILED and shared."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import DiskTier, EntryState

from .conftest import CountingFetch, blob, key_for, temp_files

DATA = blob(1, 200_000)
KEY = key_for(DATA)


@pytest.mark.parametrize(
    "cancel", [KeyboardInterrupt, SystemExit, asyncio.CancelledError], ids=lambda c: c.__name__
)
def test_cancelled_download_returns_the_entry_to_absent(
    cache_dir: Path, cancel: type[BaseException]
) -> None:
    tier = DiskTier(cache_dir)
    started, release = threading.Event(), threading.Event()

    def cancelled_fetch(f: BinaryIO) -> None:
        f.write(DATA[:1000])
        started.set()
        release.wait(30)
        raise cancel()

    outcome: dict[str, BaseException] = {}

    def first() -> None:
        try:
            tier.get(KEY, len(DATA), cancelled_fetch)
        except BaseException as exc:
            outcome["first"] = exc

    waiter_fetch = CountingFetch(DATA)
    got: dict[str, bytes] = {}

    def waiter() -> None:
        got["path"] = tier.get(KEY, len(DATA), waiter_fetch).read_bytes()

    t1 = threading.Thread(target=first)
    t1.start()
    assert started.wait(30)
    t2 = threading.Thread(target=waiter)
    t2.start()
    release.set()
    t1.join(30)
    t2.join(30)
    assert isinstance(outcome["first"], cancel)
    # the waiter was not handed an error: it fetched the entry itself
    assert got["path"] == DATA
    assert waiter_fetch.calls == 1
    assert [e.state for e in tier.entries()] == [EntryState.READY]
    assert tier.lifetime_counters().get("failures", 0) == 0
    assert temp_files(cache_dir) == []
    tier.close()


def test_interrupted_row_is_absent_not_failed(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir)
    with pytest.raises(KeyboardInterrupt):
        tier.get(KEY, len(DATA), CountingFetch(DATA, fail=KeyboardInterrupt()))
    assert tier.entries() == []
    # a real error still is a failure, recorded for the requests that waited for it
    with pytest.raises(Exception, match="boom"):
        tier.get(KEY, len(DATA), CountingFetch(DATA, fail=OSError("boom")))
    assert [e.state for e in tier.entries()] == [EntryState.FAILED]
    tier.close()


def _slow_fetcher(root: str, ready: str) -> None:
    """Child: start the download, announce it, trickle until SIGINT'd (Ctrl-C)."""
    tier = DiskTier(root)

    def fetch(f: BinaryIO) -> None:
        f.write(DATA[:10])
        f.flush()
        Path(ready).write_text("go")
        time.sleep(60)
        f.write(DATA[10:])

    try:
        tier.get(KEY, len(DATA), fetch)
    except KeyboardInterrupt:
        os._exit(17)
    os._exit(0)


def test_ctrl_c_in_another_process_lets_the_waiter_fetch(cache_dir: Path, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = mp.get_context("fork").Process(target=_slow_fetcher, args=(str(cache_dir), str(ready)))
    child.start()
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline
        assert child.is_alive()
        time.sleep(0.01)
    tier = DiskTier(cache_dir)
    fetch = CountingFetch(DATA)
    result: dict[str, object] = {}

    def wait_for_it() -> None:
        try:
            result["data"] = tier.get(KEY, len(DATA), fetch).read_bytes()
        except BaseException as exc:
            result["error"] = exc

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.2)  # let the waiter block on the child's lock (not asserted on)
    os.kill(child.pid or 0, signal.SIGINT)
    child.join(30)
    waiter.join(60)
    assert child.exitcode == 17
    assert result.get("data") == DATA, result
    assert fetch.calls == 1
    assert tier.lifetime_counters().get("failures", 0) == 0
    tier.close()
