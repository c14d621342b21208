"""The native gather behind the batch transport's copy (fastload._native.gather):
contents, bounds (nothing copied, the first bad row named), the GIL released for
the whole copy, and the transport's error for a span past its shard's end."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path

import numpy as np
import pytest
from ds_helpers import write_dataset

import fastload
from fastload import _native
from fastload.errors import CacheError
from fastload.loader.transport import BatchBuilder, RefBatch, collate_refs, gather_numpy


def _rows(*rows: tuple[int, int, int, int]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def test_gathers_ranges_of_several_kinds_of_buffer(tmp_path: Path) -> None:
    path = tmp_path / "src"
    path.write_bytes(bytes(range(256)) * 4)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        arr = np.arange(100, 200, dtype=np.uint8)
        raw = b"abcdefghij"
        dst = np.zeros(32, dtype=np.uint8)
        pieces = _rows((0, 1000, 8, 0), (1, 3, 4, 8), (2, 2, 5, 12), (1, 0, 0, 17), (2, 0, 1, 31))
        assert _native.gather(dst, [mm, arr, raw], pieces) == -1
    want = bytes(range(256)) * 4
    assert bytes(dst[:8]) == want[1000:1008]
    assert bytes(dst[8:12]) == bytes([103, 104, 105, 106])
    assert bytes(dst[12:17]) == b"cdefg"
    assert bytes(dst[17:31]) == bytes(14)  # untouched
    assert bytes(dst[31:]) == b"a"


@pytest.mark.parametrize(
    "bad",
    [
        (0, 6, 5, 0),  # past the source's end
        (0, 0, 5, 28),  # past the destination's end
        (2, 0, 1, 0),  # no such source
        (-1, 0, 1, 0),
        (0, -1, 2, 0),  # negative offset
        (0, 0, -1, 0),  # negative size
        (0, 0, 1, -1),
        (0, 2**62, 2**62, 0),  # sums that overflow
        (0, 1, 2**63 - 1, 0),
    ],
)
def test_a_row_out_of_bounds_is_named_and_nothing_is_copied(
    bad: tuple[int, int, int, int],
) -> None:
    dst = np.zeros(32, dtype=np.uint8)
    pieces = _rows((0, 0, 4, 0), (1, 0, 3, 4), bad, (0, 0, 2, 10))
    assert _native.gather(dst, [b"0123456789", b"xyz"], pieces) == 2
    assert not dst.any()  # the good rows before it were not copied either


def test_the_numpy_fallback_answers_and_copies_as_the_native_gather() -> None:
    """Random rows, many out of bounds: the fallback (a tree without the extension)
    and the C++ gather agree on the answer and on every destination byte."""
    rng = np.random.default_rng(7)
    sources = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 5, 40, 97)]
    for _ in range(500):
        n = int(rng.integers(0, 6))
        rows = rng.integers(-2, 100, (n, 4)).astype(np.int64)
        rows[:, 0] = rng.integers(-1, 5, n)
        native, fallback = np.zeros(64, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
        got = _native.gather(native, sources, rows)
        assert gather_numpy(fallback, sources, rows) == got
        assert bytes(native) == bytes(fallback)


def test_refuses_a_read_only_destination_and_malformed_rows() -> None:
    with pytest.raises((BufferError, TypeError)):
        _native.gather(b"0123", [b"ab"], _rows((0, 0, 1, 0)))
    dst = np.zeros(4, dtype=np.uint8)
    with pytest.raises(TypeError):
        _native.gather(dst, [b"ab"], np.zeros((1, 3), dtype=np.int64))
    narrow = np.array([[0, 1, 1, 3]], dtype=np.int32)  # converted, not refused
    assert _native.gather(dst, [b"ab"], narrow) == -1
    assert bytes(dst) == b"\0\0\0b"
    with pytest.raises(TypeError):
        _native.gather(dst, [object()], _rows((0, 0, 1, 0)))  # not a buffer


def test_the_copy_runs_without_the_gil() -> None:
    """Another thread runs Python while one gather copies: it sees the destination
    half written (the first piece copied, the last not yet), which a copy holding the
    GIL from start to end would never let it see."""
    src = np.ones(256 << 20, dtype=np.uint8)
    pieces = _rows(*[(0, k << 20, 1 << 20, k << 20) for k in range(256)])
    half_seen, stop = threading.Event(), threading.Event()
    dst = np.zeros_like(src)

    def watch() -> None:
        while not stop.is_set() and not half_seen.is_set():
            if dst[0] and not dst[-1]:
                half_seen.set()

    t = threading.Thread(target=watch)
    t.start()
    try:
        for _ in range(20):  # ~50 ms a copy; one is enough unless the watcher was asleep
            dst[:] = 0
            assert _native.gather(dst, [src], pieces) == -1
            assert dst.all()
            if half_seen.is_set():
                break
    finally:
        stop.set()
        t.join(10)
    assert half_seen.is_set()


def test_a_span_past_the_end_of_its_shard_is_a_cache_error_naming_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ds"
    m = write_dataset(url, n=20, shard_size="16KB")
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache")
    try:
        rb = collate_refs([ds.source.ref(i) for i in range(3)])
        spans = rb.spans.copy()
        spans[1, 0] = (m.shards[int(rb.shards[1])].bytes - 10, 100)
        bad = RefBatch(rb.keys, rb.shards, rb.fields, spans)
        name = m.shards[int(rb.shards[1])].name
        with pytest.raises(CacheError, match=rf"runs past the end of cached shard '{name}'"):
            BatchBuilder(ds.source).build(bad)
        assert BatchBuilder(ds.source).build(rb)["__key__"] == rb.keys  # the good one builds
    finally:
        ds.close()


def test_planning_the_next_batch_overlaps_building_this_one(tmp_path: Path) -> None:
    """With ``pull_in_thread`` (raw batches planned in the loader's process) batch k+1
    is drawn from the plan while batch k is built, not after it."""
    url = f"file://{tmp_path}/ds"
    write_dataset(url, n=8, shard_size="16KB")
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache")
    pulled = [threading.Event() for _ in range(5)]
    overlapped: list[bool] = []

    class Builder(BatchBuilder):
        def build(self, rb: RefBatch, views: object = None) -> object:
            k = int(rb.keys[0])
            if k + 1 < 4:  # the last batch has no next one to wait for
                overlapped.append(pulled[k + 1].wait(2.0))
            return k

    def refs() -> object:
        for k in range(4):
            pulled[k].set()
            yield RefBatch([str(k)], np.zeros(1, dtype=np.int64), (), np.zeros((1, 0, 2)))

    try:
        got = list(Builder(ds.source).iterate(refs(), depth=2, pull_in_thread=True))
    finally:
        ds.close()
    assert got == [0, 1, 2, 3]
    assert overlapped == [True, True, True]


def test_batches_use_the_views_taken_when_they_were_planned(tmp_path: Path) -> None:
    """The planner, a batch ahead, closes the shards the builder is about to copy
    from (one open shard here): the builder reads them through the views taken at
    planning, and re-opens none (re-opened under a tight cache cap, they waited for
    room the planner's pins held)."""
    url = f"file://{tmp_path}/ds"
    m = write_dataset(url, n=40, shard_size="16KB")
    n = len(m.shards)
    assert n >= 3
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache", max_open_shards=1)
    source = ds.source
    planned = [threading.Event() for _ in range(n)]
    first = [int(s) for s in source._starts[:-1]]  # the first sample of each shard

    def refs() -> object:
        for k in range(n):
            rb = collate_refs([source.ref(first[k])])  # opens shard k, closes k - 1
            planned[k].set()
            yield rb

    class Builder(BatchBuilder):
        def build(self, rb: RefBatch, views: object = None) -> object:
            k = int(rb.shards[0])
            if k + 1 < n:  # build batch k only once batch k+1 has closed shard k
                assert planned[k + 1].wait(10)
            return super().build(rb, views)  # type: ignore[arg-type]

    try:
        got = list(Builder(source).iterate(refs(), depth=2, pull_in_thread=True))
        assert [b["__key__"] for b in got] == [
            [source.index(k).sample(0)["__key__"]] for k in range(n)
        ]
        assert source.shard_opens == n  # once each, by the planning
    finally:
        ds.close()
