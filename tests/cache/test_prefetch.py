"""Prefetcher: order, byte bound, headroom, error recording, clean shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from fastload.cache import Prefetcher
from fastload.errors import ConfigError


class Recorder:
    def __init__(self, sizes: dict[str, int], delay: float = 0.01) -> None:
        self.sizes = sizes
        self.delay = delay
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.done: list[str] = []

    def __call__(self, item: str) -> None:
        with self.lock:
            self.in_flight += self.sizes[item]
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay)
        if item.startswith("bad"):
            with self.lock:
                self.in_flight -= self.sizes[item]
            raise RuntimeError(f"cannot fetch {item}")
        with self.lock:
            self.in_flight -= self.sizes[item]
            self.done.append(item)


def test_fetches_everything_within_the_byte_bound() -> None:
    sizes = {f"s{i}": 100 for i in range(12)}
    rec = Recorder(sizes)
    with Prefetcher(rec, max_in_flight_bytes=250, workers=4) as pf:
        pf.schedule(list(sizes.items()))
        assert pf.wait_idle(30)
        s = pf.stats()
    assert sorted(rec.done) == sorted(sizes)
    assert rec.max_in_flight <= 200  # at most two 100-byte items fit under 250
    assert (s.completed, s.failed, s.bytes_completed, s.pending, s.in_flight) == (
        12,
        0,
        1200,
        0,
        0,
    )


def test_a_lone_item_larger_than_the_bound_still_runs() -> None:
    rec = Recorder({"huge": 10_000})
    with Prefetcher(rec, max_in_flight_bytes=100) as pf:
        pf.schedule([("huge", 10_000)])
        assert pf.wait_idle(30)
    assert rec.done == ["huge"]


def test_headroom_holds_items_back_until_there_is_room() -> None:
    room = [0]
    rec = Recorder({"a": 100, "b": 100})
    with Prefetcher(rec, max_in_flight_bytes=1000, headroom=lambda: room[0]) as pf:
        pf.schedule([("a", 100), ("b", 100)])
        time.sleep(0.5)
        assert rec.done == []
        assert pf.stats().pending == 2
        room[0] = 10_000
        assert pf.wait_idle(30)
    assert sorted(rec.done) == ["a", "b"]


def test_errors_are_recorded_not_raised_and_not_retried() -> None:
    rec = Recorder({"bad1": 10, "ok": 10})
    with Prefetcher(rec, max_in_flight_bytes=100) as pf:
        pf.schedule([("bad1", 10), ("ok", 10)])
        assert pf.wait_idle(30)
        errs = pf.errors
        assert set(errs) == {"bad1"}
        assert "cannot fetch bad1" in str(errs["bad1"])
        pf.schedule([("bad1", 10)])  # a failed item is not retried in the background
        assert pf.stats().pending == 0
        pf.forget_error("bad1")
        pf.schedule([("bad1", 10)])
        assert pf.wait_idle(30)
        assert pf.stats().failed == 2


def test_schedule_replaces_the_queue_and_close_joins_threads() -> None:
    sizes = {f"s{i}": 1 for i in range(100)}
    rec = Recorder(sizes, delay=0.02)
    before = set(threading.enumerate())
    pf = Prefetcher(rec, max_in_flight_bytes=10, workers=2)
    pf.schedule(list(sizes.items()))
    time.sleep(0.1)
    pf.schedule([("s99", 1)])
    assert pf.stats().pending <= 1
    assert pf.close(timeout=10)
    assert not any(
        t.name.startswith("fastload-prefetch") for t in set(threading.enumerate()) - before
    )
    assert len(rec.done) < 100
    pf.schedule([("s0", 1)])  # after close: ignored
    assert pf.stats().pending == 0


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        Prefetcher(lambda item: None, max_in_flight_bytes=0)
    with pytest.raises(ConfigError):
        Prefetcher(lambda item: None, max_in_flight_bytes=1, workers=0)
