"""The GET slots that every whole-object download of a process shares: first come,
first served, and never lost by a cancelled or interrupted waiter."""

from __future__ import annotations

import threading
import time

import pytest

from fastload.config import FetchConfig
from fastload.storage import open_store
from fastload.storage.store import _Cancelled, _StreamSlots
from support.seaweed import SeaweedServer


def _wait_for(pred: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def _queued_waiter(
    slots: _StreamSlots, cancel: threading.Event | None
) -> tuple[threading.Thread, list[BaseException]]:
    """A thread waiting in ``slots.acquire(cancel)`` (every slot taken), started and
    seen in the queue; what the acquire raises is appended to the list returned."""
    raised: list[BaseException] = []

    def waiter() -> None:
        try:
            slots.acquire(cancel)
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    _wait_for(lambda: len(slots._waiters) == 1)
    return t, raised


def test_released_slots_go_to_waiters_in_arrival_order() -> None:
    slots = _StreamSlots(1)
    slots.acquire(None)
    order: list[int] = []
    threads = []
    for i in range(5):
        t = threading.Thread(target=lambda i=i: (slots.acquire(None), order.append(i)))
        t.start()
        threads.append(t)
        _wait_for(lambda n=i + 1: len(slots._waiters) == n)
    for k in range(5):
        slots.release()
        _wait_for(lambda k=k: len(order) == k + 1)
    for t in threads:
        t.join()
    assert order == [0, 1, 2, 3, 4]
    slots.release()
    assert slots._free == 1
    assert not slots._waiters


def test_a_cancelled_waiter_leaves_the_queue_and_loses_no_slot() -> None:
    slots = _StreamSlots(1)
    slots.acquire(None)
    cancel = threading.Event()
    t, raised = _queued_waiter(slots, cancel)
    cancel.set()
    t.join(timeout=5)
    assert len(raised) == 1
    assert isinstance(raised[0], _Cancelled)
    assert not slots._waiters
    slots.release()
    assert slots._free == 1


def test_an_interrupted_waiter_handed_a_slot_passes_it_on() -> None:
    """A KeyboardInterrupt lands just after the slot was handed to the waiter: the slot
    goes on to the next waiter instead of being lost."""

    class InterruptedAfterGrant(_StreamSlots):
        @staticmethod
        def _wait(granted: threading.Event, cancel: threading.Event | None) -> None:
            granted.wait(10)
            raise KeyboardInterrupt

    slots = InterruptedAfterGrant(1)
    slots.acquire(None)
    t, raised = _queued_waiter(slots, None)
    nxt = threading.Event()
    slots._waiters.append(nxt)  # a second waiter behind it
    slots.release()  # handed to the interrupted waiter
    t.join(timeout=10)
    assert len(raised) == 1
    assert isinstance(raised[0], KeyboardInterrupt)
    assert nxt.is_set()  # passed on
    assert not slots._waiters


def test_stores_of_one_endpoint_share_the_slots(seaweed: SeaweedServer) -> None:
    fetch = FetchConfig(streams=3)
    a = open_store(seaweed.new_url(), seaweed.storage_options, fetch=fetch)
    b = open_store(seaweed.new_url(), seaweed.storage_options, fetch=fetch)
    assert a._stream_slots() is b._stream_slots()
    assert a._stream_slots()._free == 3


def test_parallel_downloads_keep_to_the_stream_limit(seaweed: SeaweedServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Four objects of four parts each downloaded at once through 3 slots: never more
    than 3 GETs in flight, all bytes right."""
    fetch = FetchConfig(part_size=64 * 1024, parallel_threshold=64 * 1024, concurrency=4,
                        streams=3)  # fmt: skip
    store = open_store(seaweed.new_url(), seaweed.storage_options, fetch=fetch)
    blobs = {f"o{i}": bytes([i]) * (256 * 1024) for i in range(4)}
    for name, data in blobs.items():
        store.write_bytes(name, data)
    slots = store._stream_slots()
    peak = [0]
    real_acquire = slots.acquire

    def counting_acquire(cancel: threading.Event | None) -> None:
        real_acquire(cancel)
        peak[0] = max(peak[0], 3 - slots._free)

    slots.acquire = counting_acquire  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def get(name: str) -> None:
        try:
            store.download(name, str(tmp_path / name), expected_size=len(blobs[name]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=get, args=(n,)) for n in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert peak[0] <= 3
    for name, data in blobs.items():
        assert (tmp_path / name).read_bytes() == data
    assert slots._free == 3


@pytest.mark.parametrize("bad", [0, -1])
def test_streams_must_be_positive(bad: int) -> None:
    from fastload.errors import ConfigError

    with pytest.raises(ConfigError, match="streams"):
        FetchConfig(streams=bad)


def test_small_objects_do_not_queue_behind_held_slots(seaweed: SeaweedServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Index sidecars and manifests (up to 1 MiB) are read while every slot is taken by
    shard parts: the plan needs them before the shards."""
    store = open_store(seaweed.new_url(), seaweed.storage_options, fetch=FetchConfig(streams=1))
    store.write_bytes("small", b"x" * 1000)
    store.write_bytes("big", b"y" * (2 << 20))
    slots = store._stream_slots()
    slots.acquire(None)  # every slot held
    try:
        assert store.download("small", str(tmp_path / "small"), expected_size=1000) == 1000
        got: list[int] = []
        t = threading.Thread(
            target=lambda: got.append(store.download("big", str(tmp_path / "big"), 2 << 20))
        )
        t.start()
        _wait_for(lambda: len(slots._waiters) == 1)  # the big one waits for a slot
        assert got == []
    finally:
        slots.release()
    t.join(timeout=60)
    assert got == [2 << 20]
    assert (tmp_path / "big").read_bytes() == b"y" * (2 << 20)
