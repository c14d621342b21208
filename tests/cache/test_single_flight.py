"""Single flight across threads and processes; failures wake every waiter; deadlines."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import DiskTier
from fastload.cache.locks import LockTimeout
from fastload.errors import CacheError

from .conftest import CountingFetch, append_line, blob, key_for

PROCS = 8
THREADS = 3


def _counting_slow_fetch(
    counter_dir: Path, shard: str, data: bytes, fail: str = ""
) -> Callable[[BinaryIO], None]:
    def fetch(f: BinaryIO) -> None:
        append_line(counter_dir / shard, str(os.getpid()))
        for i in range(0, len(data), 4096):  # slow and chunked, so the others must wait
            f.write(data[i : i + 4096])
            time.sleep(0.01)
        if fail:
            raise RuntimeError(fail)

    return fetch


def _run_procs(target: Callable[[int], None], n: int) -> list[int]:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return [-999 if c is None else c for c in codes]


def test_eight_processes_with_threads_fetch_each_shard_once(
    cache_dir: Path, tmp_path: Path
) -> None:
    counters = tmp_path / "counters"
    counters.mkdir()
    shards = {f"shard-{i:06d}.tar": blob(100 + i, 40_000) for i in range(3)}
    # created before the fork: children inherit it and must not reuse its connection
    tier = DiskTier(cache_dir, cache_limit="1MB")
    tier.stats()
    barrier = mp.get_context("fork").Barrier(PROCS)

    def child(n: int) -> None:
        barrier.wait(60)
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            names = list(shards)
            random.Random(n * 10 + t).shuffle(names)
            try:
                for name in names:
                    data = shards[name]
                    with tier.pinned(
                        key_for(data, name), len(data), _counting_slow_fetch(counters, name, data)
                    ) as path:
                        assert path.read_bytes() == data
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tier.close()  # writes this process's hits into the lifetime counters
        os._exit(1 if errors else 0)

    assert _run_procs(child, PROCS) == [0] * PROCS
    for name in shards:
        assert len((counters / name).read_text().splitlines()) == 1, name
    fresh = DiskTier(cache_dir)
    assert fresh.verify() == []
    total = fresh.lifetime_counters()
    assert total["fetches"] == 3
    assert total["hits"] == PROCS * THREADS * 3 - 3
    assert all(e.pins == 0 for e in fresh.entries())


def test_a_failing_fetch_wakes_every_waiter_with_its_error(cache_dir: Path, tmp_path: Path) -> None:
    counters = tmp_path / "counters"
    counters.mkdir()
    results = tmp_path / "results"
    data = blob(200, 60_000)
    name = "shard-000042.tar"
    tier = DiskTier(cache_dir)
    barrier = mp.get_context("fork").Barrier(PROCS)

    def child(n: int) -> None:
        barrier.wait(60)

        def worker(t: int) -> None:
            fetch = _counting_slow_fetch(counters, name, data, fail="backend said 503")
            try:
                tier.get(key_for(data, name), len(data), fetch)
                append_line(results, "returned")
            except CacheError as exc:
                append_line(results, "CacheError " + str(exc).replace("\n", " "))
            except BaseException as exc:
                append_line(results, f"other {exc!r}")

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(0)

    t0 = time.monotonic()
    assert _run_procs(child, PROCS) == [0] * PROCS
    assert time.monotonic() - t0 < 100  # nobody hung until the 600 s wait deadline
    lines = results.read_text().splitlines()
    assert len(lines) == PROCS * 2
    assert all(line.startswith("CacheError") for line in lines), lines
    assert all(name in line and "backend said 503" in line for line in lines), lines
    assert len((counters / name).read_text().splitlines()) == 1
    # a fresh request after the failure retries
    assert tier.get(key_for(data, name), len(data), CountingFetch(data)).read_bytes() == data


@pytest.mark.parametrize("same_tier", [True, False], ids=["thread-lock", "flock"])
def test_waiting_past_the_deadline_raises(cache_dir: Path, same_tier: bool) -> None:
    data = blob(300, 1000)
    key = key_for(data)
    slow_tier = DiskTier(cache_dir, wait_deadline_s=60)
    waiter = slow_tier if same_tier else DiskTier(cache_dir, wait_deadline_s=0.3)
    waiter.wait_deadline_s = 0.3
    started, release = threading.Event(), threading.Event()

    def slow(f: BinaryIO) -> None:
        started.set()
        release.wait(30)
        f.write(data)

    t = threading.Thread(target=slow_tier.get, args=(key, len(data), slow))
    t.start()
    try:
        assert started.wait(10)
        with pytest.raises(LockTimeout, match="timed out after") as info:
            waiter.get(key, len(data), CountingFetch(data))
        assert "shard-000000.tar" in str(info.value)
        assert isinstance(info.value, CacheError)
    finally:
        release.set()
        t.join(30)
    assert waiter.get(key, len(data), CountingFetch(data)).read_bytes() == data


def test_a_thread_waiting_for_another_threads_download_counts_a_wait_and_a_hit(
    cache_dir: Path,
) -> None:
    data = blob(400, 2000)
    key = key_for(data)
    tier = DiskTier(cache_dir)
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(f: BinaryIO) -> None:
        calls.append(1)
        started.set()
        release.wait(30)
        f.write(data)

    t = threading.Thread(target=tier.get, args=(key, len(data), slow))
    t.start()
    assert started.wait(10)
    waiter_result: list[Path] = []
    w = threading.Thread(target=lambda: waiter_result.append(tier.get(key, len(data), slow)))
    w.start()
    time.sleep(0.2)
    release.set()
    t.join(30)
    w.join(30)
    assert waiter_result[0].read_bytes() == data
    s = tier.stats()
    assert (len(calls), s.fetches, s.misses, s.hits, s.waits) == (1, 1, 1, 1, 1)
    assert s.wait_s > 0
