"""Device feeding: the prefetcher over the CPU no-op stream (and the CUDA stream where
a GPU exists), the bounded host-buffer pool, nested batches."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from fastload.loader import DataLoader, DevicePrefetcher, HostBufferPool, SyncCopyStream
from fastload.loader.device import (
    CudaCopyStream,
    byte_bucket,
    make_copy_stream,
    map_tensors,
    tensor_leaves,
)
from fastload.packed import PackedBytes
from fastload.sampling.world import World

from .doubles import SquaresDataset, indices

Pair = namedtuple("Pair", ["a", "b"])

#: the CPU, and CUDA where a GPU exists: the copy streams' and the loader's devices
DEVICES = STREAMS = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


def stream_for(name: str) -> SyncCopyStream | CudaCopyStream:
    return SyncCopyStream("cpu") if name == "cpu" else CudaCopyStream("cuda")


def nested_batch(i: int) -> dict[str, Any]:
    return {
        "img": torch.full((2, 3), float(i)),
        "meta": [torch.tensor([i]), "label", 3.5, None],
        "pair": Pair(torch.arange(4) + i, (torch.zeros(1), "x")),
        "key": f"k{i}",
    }


def test_map_tensors_keeps_structure_and_leaves_non_tensors() -> None:
    batch = nested_batch(1)
    out = map_tensors(batch, lambda t: t * 2)
    assert isinstance(out["pair"], Pair)
    assert isinstance(out["meta"], list)
    assert isinstance(out["pair"].b, tuple)
    assert out["meta"][1:] == ["label", 3.5, None]
    assert out["key"] == "k1"
    assert torch.equal(out["img"], batch["img"] * 2)
    assert len(tensor_leaves(batch)) == 4


@pytest.mark.parametrize("stream", STREAMS)
def test_prefetcher_moves_nested_batches_in_order(stream: str) -> None:
    prefetcher = DevicePrefetcher(stream_for(stream), stage=True, max_buffers=16)
    device = prefetcher.stream.device
    out = list(prefetcher.iterate(nested_batch(i) for i in range(6)))
    assert len(out) == 6
    for i, b in enumerate(out):
        assert b["img"].device == device
        assert torch.equal(b["img"].cpu(), torch.full((2, 3), float(i)))
        assert torch.equal(b["pair"].a.cpu(), torch.arange(4) + i)
        assert b["meta"][1] == "label"
        assert b["key"] == f"k{i}"
    stats = prefetcher.pool.stats()
    # 4 tensors per batch, same shapes every batch: only the first batch (and the
    # one in flight with it) allocates, the rest reuse
    assert stats.allocations <= 8
    assert stats.reuses == 6 * 4 - stats.allocations
    assert stats.reuses >= 16
    assert stats.overflows == 0


@pytest.mark.parametrize("stream", STREAMS)
def test_staged_buffers_are_not_aliased_by_yielded_batches(stream: str) -> None:
    # the pool reuses host buffers: batches already yielded must keep their values
    prefetcher = DevicePrefetcher(stream_for(stream), stage=True, max_buffers=2)
    out = list(prefetcher.iterate({"x": torch.full((8,), float(i))} for i in range(10)))
    assert [int(b["x"][0]) for b in out] == list(range(10))
    assert prefetcher.pool.stats().reuses >= 8


def test_prefetcher_without_staging_uses_no_pool() -> None:
    prefetcher = DevicePrefetcher(SyncCopyStream(), stage=False)
    src = torch.ones(3)
    (out,) = list(prefetcher.iterate(iter([src])))
    assert torch.equal(out, src)
    assert out.data_ptr() != src.data_ptr()  # a copy, as a device copy would be
    assert prefetcher.pool.stats().allocations == 0


def test_prefetcher_on_empty_source() -> None:
    assert list(DevicePrefetcher(SyncCopyStream()).iterate(iter([]))) == []


class PendingEvent:
    """An event that completes only when waited on (a copy still running)."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_pool_reuses_only_after_the_copy_event_completed() -> None:
    pool = HostBufferPool(max_buffers=2, pin=False)
    a = pool.acquire((4,), torch.float32)
    ev_a = PendingEvent()
    pool.release_after([a], ev_a)
    b = pool.acquire((4,), torch.float32)  # a is still in flight: a new buffer
    assert b.data_ptr() != a.data_ptr()
    pool.release_after([b], PendingEvent())
    assert pool.stats().in_flight == 2
    c = pool.acquire((4,), torch.float32)  # full, all in flight: waits for the oldest
    assert ev_a.done
    assert c.data_ptr() == a.data_ptr()
    s = pool.stats()
    assert (s.allocations, s.reuses, s.waits) == (2, 1, 1)


def test_pool_is_bounded_and_evicts_other_shapes() -> None:
    pool = HostBufferPool(max_buffers=3, pin=False)
    for n in range(1, 8):  # a new shape each time (variable-size batches)
        buf = pool.acquire((n,), torch.uint8)
        pool.release_after([buf], _done())
        s = pool.stats()
        assert s.free + s.in_flight <= 3
    s = pool.stats()
    assert s.allocations == 7
    assert s.evictions == 4
    assert s.reuses == 0


def test_pool_overflows_rather_than_deadlocks_on_a_huge_batch() -> None:
    pool = HostBufferPool(max_buffers=2, pin=False)
    held = [pool.acquire((2,), torch.float32) for _ in range(4)]
    assert len({t.data_ptr() for t in held}) == 4
    assert pool.stats().overflows == 2
    pool.release_after(held, _done())
    assert pool.stats().free == 2  # trimmed back under the cap


def _done() -> Any:
    return SyncCopyStream().record_event()


def test_make_copy_stream_picks_the_no_op_stream_off_cuda() -> None:
    assert isinstance(make_copy_stream("cpu"), SyncCopyStream)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_device_feeding_on_cpu_uses_the_pool(num_workers: int) -> None:
    def make(**kw: Any) -> DataLoader:
        return DataLoader(
            SquaresDataset(20),
            batch_size=4,
            shuffle=True,
            num_workers=num_workers,
            world=World.single(),
            **kw,
        )

    plain = [(indices(b), b["img"]) for b in make()]
    fed_loader = make(device="cpu", pin_memory=True)
    assert fed_loader.pool_stats() is None  # nothing touched before iteration
    fed = list(fed_loader)
    assert [indices(b) for b in fed] == [i for i, _ in plain]
    for b, (_, img) in zip(fed, plain, strict=True):
        assert torch.equal(b["img"], img)
        assert b["name"][0].startswith("s")
    stats = fed_loader.pool_stats()
    assert stats is not None
    assert stats.pinned is False  # no pinned allocator without CUDA
    # per batch: the idx tensor and the img tensor are staged; 5 batches
    assert stats.allocations + stats.reuses == 10
    assert stats.reuses >= 6


def test_dataloader_device_without_pinning_does_not_stage() -> None:
    loader = DataLoader(SquaresDataset(8), batch_size=4, device="cpu", world=World.single())
    assert len(list(loader)) == 2
    stats = loader.pool_stats()
    assert stats is not None
    assert stats.allocations == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_on_cuda_delivers_pinned_copies(num_workers: int) -> None:
    loader = DataLoader(
        SquaresDataset(40),
        batch_size=8,
        num_workers=num_workers,
        device="cuda",
        world=World.single(),
    )
    total = 0.0
    for b in loader:
        assert b["img"].is_cuda
        total += float(b["img"].sum())
    assert total == sum(range(40)) * 48
    stats = loader.pool_stats()
    assert stats is not None
    if num_workers == 0:  # the loader's own pinned pool stages
        assert stats.pinned
        assert stats.reuses > 0
    else:  # torch's pin-memory thread pinned the batches already
        assert stats.allocations == 0


def packed_batch(i: int) -> dict[str, Any]:
    # byte counts that change a little from batch to batch, like a batch of JPEGs
    items = [bytes([(i + k) % 256]) * (70_000 + 997 * ((i * 7 + k) % 5)) for k in range(3)]
    return {"jpg": PackedBytes.from_list([*items, None]), "cls": torch.arange(4) + i}


@pytest.mark.parametrize("stream", STREAMS)
def test_packed_bytes_move_in_one_staged_copy_and_come_out_equal(stream: str) -> None:
    prefetcher = DevicePrefetcher(stream_for(stream), stage=True, max_buffers=8)
    device = prefetcher.stream.device
    expected = [packed_batch(i) for i in range(8)]
    out = list(prefetcher.iterate(packed_batch(i) for i in range(8)))
    assert len(out) == 8
    for b, e in zip(out, expected, strict=True):
        p = b["jpg"]
        assert isinstance(p, PackedBytes)
        assert p.data.device == device
        assert p == e["jpg"]  # the same bytes, offsets and missing list
        assert p.missing == (3,)
        assert p.tolist()[:3] == e["jpg"].tolist()[:3]
        assert torch.equal(b["cls"].cpu(), e["cls"])
    stats = prefetcher.pool.stats()
    # two leaves per batch (the packed buffer and cls) are staged; the packed byte
    # counts differ between batches but fall into one rounded-up size, so buffers
    # are reused instead of evicted
    assert stats.allocations + stats.reuses == 16
    assert stats.reuses >= 10
    assert stats.evictions == 0


def test_packed_bytes_are_one_leaf_of_map_tensors() -> None:
    batch = packed_batch(2)
    seen: list[torch.Tensor] = []

    def record(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return t.clone()

    out = map_tensors(batch, record)
    assert len(seen) == 2
    assert seen[0] is batch["jpg"].data  # the buffer whole, not per-item views
    assert isinstance(out["jpg"], PackedBytes)
    assert out["jpg"] == batch["jpg"]
    assert out["jpg"].data.data_ptr() != batch["jpg"].data.data_ptr()
    assert [t is batch["jpg"].data for t in tensor_leaves(batch)] == [True, False]
    routed = map_tensors(batch, lambda t: t, packed_fn=lambda t: t[:0].clone())
    assert routed["jpg"].nbytes == 0
    assert routed["cls"] is batch["cls"]


def test_byte_buckets_round_up_by_at_most_a_quarter() -> None:
    assert byte_bucket(0) == byte_bucket(1) == 1 << 16
    for n in [65_537, 100_000, 131_072, 1_000_000, 38_535_168, 123_456_789]:
        b = byte_bucket(n)
        assert n <= b <= 1.25 * n
        assert byte_bucket(b) == b


def test_unstaged_packed_bytes_are_copied_from_where_they_are() -> None:
    prefetcher = DevicePrefetcher(SyncCopyStream(), stage=False)
    batch = packed_batch(0)
    (out,) = list(prefetcher.iterate(iter([batch])))
    assert out["jpg"] == batch["jpg"]
    assert out["jpg"].data.data_ptr() != batch["jpg"].data.data_ptr()
    assert prefetcher.pool.stats().allocations == 0


def _pack_names(items: list[dict[str, Any]]) -> dict[str, Any]:
    # a collate that packs a bytes field, as the raw-field transport does
    return {
        "idx": torch.tensor([it["idx"] for it in items]),
        "raw": PackedBytes.from_list([it["name"].encode() * 5000 for it in items]),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_delivers_packed_fields_on_the_device(device: str, num_workers: int) -> None:
    loader = DataLoader(
        SquaresDataset(24),
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=_pack_names,
        device=device,
        pin_memory=True,
        world=World.single(),
    )
    seen: list[int] = []
    for b in loader:
        raw = b["raw"]
        assert isinstance(raw, PackedBytes)
        assert raw.data.device.type == device
        assert raw.tolist() == [f"s{int(i)}".encode() * 5000 for i in b["idx"].cpu()]
        seen.extend(int(i) for i in b["idx"].cpu())
    assert sorted(seen) == list(range(24))
