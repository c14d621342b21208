"""Worker processes refill their shared-memory batch slabs (fastload.loader.worker_slabs)
only once nothing in the loader's process refers to a batch: batches the caller keeps,
drops at random points, keeps across epochs and worker generations, or abandons
mid-epoch keep exactly the pixels a fresh decode gives, and slabs are reused."""

from __future__ import annotations

import gc
import io
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.decode import Decoder
from fastload.loader.decoded import decode_batch
from fastload.loader.worker_slabs import SLAB_SPARE, SLAB_TAG, SlabChannel, _WorkerSide

N = 60


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (40 + i % 7, 56, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("slabs")
    url = f"file://{root}/shards"
    with fastload.ShardWriter(url, shard_size="60KB") as w:
        for i in range(N):
            w.write({"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": i % 3})
    return url


def _expected(ds: Any) -> dict[str, torch.Tensor]:
    return {ds[i]["__key__"]: ds[i]["jpg"].clone() for i in range(len(ds))}


def _check(batch: dict[str, Any], want: dict[str, torch.Tensor]) -> None:
    assert SLAB_TAG not in batch
    for k, key in enumerate(batch["__key__"]):
        assert torch.equal(batch["jpg"][k], want[key]), key


def _keep_every(loader: Any, want: dict[str, torch.Tensor], epochs: int, every: int) -> None:
    # epochs of checked batches, every ``every``-th kept to the end, then checked again:
    # a slab refilled while kept fails the second check
    kept: list[dict[str, Any]] = []
    for _ in range(epochs):
        for k, batch in enumerate(loader):
            _check(batch, want)
            if k % every == 0:
                kept.append(batch)
            del batch
    for old in kept:
        _check(old, want)


@pytest.mark.parametrize("persistent", [False, True])
def test_kept_and_dropped_batches_keep_their_pixels(url: str, persistent: bool) -> None:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
    want = _expected(ds)
    loader = fastload.DataLoader(
        ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=persistent
    )
    rng = random.Random(7)
    kept: list[dict[str, Any]] = []
    try:
        assert isinstance(loader.worker_slabs, SlabChannel)
        assert loader.worker_slabs.slots == 2 + SLAB_SPARE
        for epoch in range(4):
            for batch in loader:
                _check(batch, want)
                assert batch["jpg"].is_shared()
                if rng.random() < 0.3:
                    kept.append(batch)  # held across batches, epochs and workers
                if kept and rng.random() < 0.2:
                    kept.pop(rng.randrange(len(kept)))  # let go mid-epoch
                    gc.collect()
                del batch
            for old in kept:  # nothing kept was refilled meanwhile
                _check(old, want)
            if epoch == 1:
                kept.clear()
                gc.collect()
        stats = loader.worker_slabs.stats()
        assert stats["reused"] > 0
        # slabs are made per worker process: 2 per epoch without persistent workers
        processes = 2 if persistent else 8
        assert stats["allocated"] <= processes * loader.worker_slabs.slots
    finally:
        loader.close()
        ds.close()


def _flip(sample: dict[str, Any]) -> dict[str, Any]:
    return dict(sample, jpg=sample["jpg"].flip(-1))


@pytest.mark.parametrize("kind", ["streaming", "transform"])
def test_batches_stacked_by_the_collate_recycle_too(url: str, kind: str) -> None:
    # images decoded one by one (a StreamingDataset, a transform) are stacked by the
    # collate into the worker's slabs
    if kind == "streaming":
        ds: Any = fastload.StreamingDataset(url, decode="tensor", size=(24, 32))
        plain = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
        want = _expected(plain)
        plain.close()
    else:
        ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32), transform=_flip)
        want = _expected(ds)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    try:
        assert loader.worker_slabs is not None
        _keep_every(loader, want, epochs=3, every=4)
        assert loader.worker_slabs.stats()["reused"] > 0
    finally:
        loader.close()
        ds.close()


def test_an_abandoned_epoch_leaves_later_epochs_right(url: str) -> None:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
    want = _expected(ds)
    loader = fastload.DataLoader(
        ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    try:
        for _epoch in range(2):
            keys: list[str] = []
            # an iteration left early: the next one goes on with the epoch's rest
            for stop in (3, 5, None):
                for k, batch in enumerate(loader):
                    _check(batch, want)
                    keys.extend(batch["__key__"])
                    if k == stop:
                        break  # the batches in flight never reach the loader's process
            assert sorted(keys) == sorted(want)
        assert loader.worker_slabs is not None
        assert loader.worker_slabs.stats()["reused"] > 0
    finally:
        loader.close()
        ds.close()


def test_nothing_held_reuses_slabs_without_fresh_memory(url: str) -> None:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
    want = _expected(ds)
    loader = fastload.DataLoader(ds, batch_size=6, num_workers=2, persistent_workers=True)
    try:
        for _ in range(3):
            for batch in loader:
                _check(batch, want)
                del batch
        assert loader.worker_slabs is not None
        stats = loader.worker_slabs.stats()
        batches = 3 * N // 6
        assert stats["fresh"] == 0
        assert stats["allocated"] + stats["reused"] == batches
        assert stats["allocated"] <= 2 * loader.worker_slabs.slots
    finally:
        loader.close()
        ds.close()


def _as_list(samples: list[Any]) -> list[Any]:
    return samples


def test_recycling_is_off_where_the_loader_cannot_see_the_batch(url: str) -> None:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
    cases: list[dict[str, Any]] = [
        {"num_workers": 2, "recycle_batches": False},  # batches passed on elsewhere
        {"num_workers": 2, "collate_fn": _as_list},  # the caller's collate
        {"num_workers": 0},  # no worker process
    ]
    try:
        for kwargs in cases:
            loader = fastload.DataLoader(ds, batch_size=5, **kwargs)
            try:
                assert loader.worker_slabs is None, kwargs
                assert sum(len(b) if isinstance(b, list) else 5 for b in loader) == N
            finally:
                loader.close()
    finally:
        ds.close()


def _received(batch: dict[str, Any]) -> dict[str, Any]:
    # what the loader's process gets from a worker: its own mapping of the slab
    t = batch["jpg"]
    storage = t.untyped_storage()
    fd, size = storage._share_fd_cpu_()
    mine = torch.UntypedStorage._new_shared_fd_cpu(os.dup(fd), size)
    base = torch.empty(0, dtype=torch.uint8).set_(mine)
    out = dict(batch)
    out["jpg"] = base.as_strided(t.size(), t.stride(), t.storage_offset())
    assert out["jpg"].data_ptr() != t.data_ptr()
    assert torch.equal(out["jpg"], t)
    return out


def _worker_here(slots: int) -> tuple[SlabChannel, Callable[[], dict[str, Any]]]:
    # a channel whose worker side runs in this process, and a batch maker through it
    channel = SlabChannel(1, slots)
    channel._side = _WorkerSide(os.getpid(), 0)
    dec = Decoder(image="tensor", size=(8, 8), resize="exact")
    raw = [{"__key__": f"k{i}", "jpg": _jpeg(i)} for i in range(3)]

    def batch() -> dict[str, Any]:
        channel.begin()
        return channel.collate(decode_batch(raw, dec, channel.alloc))

    return channel, batch


def test_a_slab_is_refilled_only_when_its_own_send_comes_back() -> None:
    # the worker's side run in this process: a slab sent with number s is free again
    # only when s is written back, not by a release of an earlier process's slab
    channel, batch = _worker_here(2)
    first = batch()
    [(name, worker, k, seq)] = first[SLAB_TAG]
    assert (name, worker, k) == ("jpg", 0, 0)
    assert seq >> 40 == os.getpid()
    second = batch()
    assert second[SLAB_TAG][0][2] == 1  # slab 0 is out: a second slab
    released = channel._released.numpy()
    released[0, 0] = ((os.getpid() + 1) << 40) | 1  # a late release of another process
    third = batch()
    assert SLAB_TAG not in third  # both slots out: fresh shared memory, untagged
    assert channel.stats() == {"allocated": 2, "reused": 0, "fresh": 1}
    first = channel.adopt(_received(first))
    assert torch.equal(first["jpg"], second["jpg"])  # the same images, decoded again
    view = first["jpg"][1:]
    del first
    gc.collect()
    assert int(released[0, 0]) != seq  # a view of the batch still holds it
    del view
    gc.collect()
    assert int(released[0, 0]) == seq
    fourth = batch()
    assert fourth[SLAB_TAG][0][2] == 0  # refilled
    assert torch.equal(fourth["jpg"], third["jpg"])
    assert channel.stats() == {"allocated": 2, "reused": 1, "fresh": 1}
    # what torch's pin-memory thread hands on: a copy, the slab already let go
    seq4 = fourth[SLAB_TAG][0][3]
    pinned = dict(fourth, jpg=fourth["jpg"].clone())
    assert not pinned["jpg"].is_shared()
    assert channel.adopt(pinned)["jpg"] is pinned["jpg"]
    assert int(released[0, 0]) == seq4


def test_spawned_workers_recycle_through_the_pickled_channel(url: str) -> None:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(24, 32))
    want = _expected(ds)
    loader = fastload.DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="spawn",
    )
    try:
        _keep_every(loader, want, epochs=2, every=3)
        assert loader.worker_slabs is not None
        stats = loader.worker_slabs.stats()  # the workers' counts, through shared memory
        assert stats["reused"] > 0
        assert stats["allocated"] <= 2 * loader.worker_slabs.slots
    finally:
        loader.close()
        ds.close()


def test_a_forked_child_letting_go_frees_nothing() -> None:
    channel, make = _worker_here(2)
    batch = channel.adopt(_received(make()))
    released = channel._released.numpy()
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the batch, runs a collection, leaves
        code = 1
        try:
            del batch
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int(released[0, 0]) == 0  # this process still holds the batch
    del batch
    gc.collect()
    assert int(released[0, 0]) != 0
