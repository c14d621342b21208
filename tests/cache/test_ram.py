"""RamTier: byte budget, LRU order, oversize values, single flight over threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from fastload.cache import RamTier
from fastload.errors import CacheError, ConfigError


def test_lru_within_budget() -> None:
    ram = RamTier(300)
    for k in "abc":
        assert ram.put(k, k.encode() * 100)
    assert ram.get("a") == b"a" * 100  # a is now most recent
    assert ram.put("d", b"d" * 100)
    assert "b" not in ram
    assert {k for k in "acd" if k in ram} == {"a", "c", "d"}
    s = ram.stats()
    assert (s.evictions, s.bytes_evicted, s.bytes_used, s.entries, s.hits) == (1, 100, 300, 3, 1)
    assert ram.get("zzz") is None
    assert ram.stats().misses == 1


def test_value_larger_than_budget_is_not_kept() -> None:
    ram = RamTier("1KB")
    assert ram.put("small", b"x" * 10)
    assert not ram.put("big", b"y" * 1001)
    assert "big" not in ram
    assert "small" in ram
    assert ram.stats().oversize == 1
    assert ram.get_or_load("big", lambda: b"y" * 1001) == b"y" * 1001
    assert ram.stats().bytes_used == 10


def test_replacing_a_key_keeps_accounting() -> None:
    ram = RamTier(100)
    ram.put("k", b"1" * 60)
    ram.put("k", b"2" * 30)
    assert ram.stats().bytes_used == 30
    ram.discard("k")
    assert ram.stats().bytes_used == 0
    ram.put("j", b"3")
    ram.clear()
    assert len(ram) == 0


def test_bad_limit() -> None:
    with pytest.raises(ConfigError, match="ram_limit"):
        RamTier("lots")


def _race(call: Callable[[], object], threads: int, gate: threading.Event) -> None:
    """Run ``call`` in ``threads`` threads at once; ``gate`` (which their loader waits
    for) opens once they all had time to ask; returns when they are done."""
    started = [threading.Thread(target=call) for _ in range(threads)]
    for t in started:
        t.start()
    time.sleep(0.05)
    gate.set()
    for t in started:
        t.join(10)


def test_get_or_load_runs_the_loader_once_for_many_threads() -> None:
    ram = RamTier(10_000)
    calls = []
    gate = threading.Event()

    def load() -> bytes:
        calls.append(1)
        gate.wait(10)
        return b"v" * 50

    out: list[bytes] = []
    _race(lambda: out.append(ram.get_or_load("k", load)), 8, gate)
    assert out == [b"v" * 50] * 8
    assert len(calls) == 1
    s = ram.stats()
    assert (s.loads, s.misses, s.hits + s.misses) == (1, 1, 8)


def test_a_failing_loader_wakes_waiters_with_its_error_and_later_calls_retry() -> None:
    ram = RamTier(10_000)
    gate = threading.Event()

    def load() -> bytes:
        gate.wait(10)
        raise RuntimeError("index fetch 500")

    errors: list[str] = []

    def call() -> None:
        try:
            ram.get_or_load("idx", load)
        except CacheError as exc:
            errors.append(str(exc))

    _race(call, 5, gate)
    assert len(errors) == 5
    assert all("index fetch 500" in e and "'idx'" in e for e in errors)
    assert ram.get_or_load("idx", lambda: b"ok") == b"ok"
    assert ram.stats().failures == 1
