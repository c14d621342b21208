"""Batches of decoded pixels built in the loader's process, out of the pixel tier.

A :class:`~fastload.ShardedDataset` with ``pixel_cache=`` reads every image of a later
epoch from the node's pixel shards: a copy out of a mapping, no decode (~50-75 µs a
sample in one process). Through DataLoader worker processes such an epoch is bounded
by torch's worker-to-main transfer instead (a fresh shared-memory segment per batch,
4.8 MB for 32 x 224 x 224 x 3: made, filled, sent and mapped again; measured 4,500-6,600
images/s on 2 cores against 14,750 in one process). So, as the batch transport does for
raw bytes (:mod:`fastload.loader.transport`), :class:`fastload.DataLoader` builds such
epochs in its own process:

* **When.** :func:`serves_pixel_batches` says whether a loader may (decided once, kept
  in its :class:`~fastload.loader.transport_plan.TransportPlan` as ``pixel_batches``):
  a ``ShardedDataset`` with the tier, decoding to one fixed shape (``decode="tensor"``
  with an exact ``size``, RGB or L), with no ``transform``, ``collate_fn``, ``sampler``
  or ``batch_sampler`` and ``transport="auto"``, i.e. where a batch is exactly a stack of
  the tier's pixels plus the other fields as the workers' collate gives them. Per
  epoch, :meth:`PixelBatcher.epoch` asks the tier whether every index of this rank's
  remaining plan is stored (:meth:`~fastload.datasets.pixels.PixelTier.missing`): if
  so the epoch is built here and no worker process runs; if not, the workers run the
  epoch as before, and fill the tier as they go.
* **How.** :func:`read_pixel_batch` allocates one ``(N, H, W, C)`` uint8 tensor per
  image field and copies each sample's stored pixels from the mapped pixel shard
  straight into its slot (``PixelTier.sample(..., out=)``: no array per image); the
  samples hold views of their slots, exactly what ``dataset[i]`` returns, and
  :func:`~fastload.loader.transport.collate_decoded` hands the batch tensors on as they
  are (channels-last ``(N, C, H, W)`` for CHW images) and collates the other fields as
  on the workers' path. Batch tensors come from the process's recycled slabs
  (:mod:`fastload.loader.slabs`), or are allocated pinned when the loader pins and
  CUDA is there. One background thread builds two batches ahead of the caller.
  The same reader serves worker processes in a filling epoch
  (:class:`fastload.loader.adapters.PixelBatchAdapter`, into shared memory).

The order is the loader's sampler's, so the batches, their order and the resume state
are the same on both paths.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from fastload.datasets.sharded import ShardedDataset
from fastload.loader.decoded import DecodedItems, fixed_image_shape
from fastload.loader.slabs import SlabPool, shared_pool
from fastload.loader.transport import collate_decoded

__all__ = [
    "PIXEL_DEPTH",
    "PixelBatcher",
    "pixel_batch_refusal",
    "read_pixel_batch",
    "serves_pixel_batches",
]

#: Batches the background thread builds ahead of the caller.
PIXEL_DEPTH = 2

Alloc = Callable[[tuple[int, ...]], torch.Tensor]


def pixel_batch_refusal(
    dataset: Any, *, transport: str, collate_fn: Any, caller_order: bool
) -> str | None:
    """Why a loader over ``dataset`` with these settings must not build batches from
    the pixel tier in its own process (None: it may; see the module docstring)."""
    tier = getattr(dataset, "pixels", None)
    if tier is None:
        return "the dataset has no pixel tier"
    name = type(dataset).__name__
    if not isinstance(dataset, ShardedDataset) or (
        type(dataset).__getitem__ is not ShardedDataset.__getitem__
    ):
        return f"{name} makes its own items from the tier"
    if transport != "auto":
        return f"transport={transport!r} asked"
    if dataset.transform is not None:
        return "the dataset has a transform"
    if tier.crop is not None or dataset.tiles is not None:
        return "its crops are cut from the stored pixels each epoch"
    if fixed_image_shape(dataset.decoder) is None:
        return "its images do not decode to one fixed shape (decode='tensor', exact size)"
    if collate_fn is not None:
        return "a collate_fn was given"
    if caller_order:
        return "a sampler or batch_sampler was given"
    return None


def serves_pixel_batches(
    dataset: Any, *, transport: str, collate_fn: Any, caller_order: bool
) -> bool:
    """Whether epochs whose every sample is in ``dataset``'s pixel tier are built in the
    loader's process (:func:`pixel_batch_refusal` says why not)."""
    refusal = pixel_batch_refusal(
        dataset, transport=transport, collate_fn=collate_fn, caller_order=caller_order
    )
    return refusal is None


def read_pixel_batch(dataset: Any, indices: Sequence[int], alloc: Alloc) -> list[Any]:
    """``[dataset[i] for i in indices]`` of a dataset :func:`serves_pixel_batches`
    accepts, each image field's pixels in slot ``k`` of one ``alloc((N, H, W, C))``
    tensor per field (a :class:`~fastload.loader.decoded.DecodedItems`): stored pixels
    copied there straight from the mapped pixel shard, an image the tier decodes afresh
    (not stored yet, no room, a bad image's error) copied after."""
    tier, source = dataset.pixels, dataset.source
    shape = fixed_image_shape(dataset.decoder)
    assert tier is not None
    assert shape is not None
    n = len(indices)
    batches: dict[str, torch.Tensor] = {}
    arrays: dict[str, np.ndarray] = {}

    def slot(name: str, k: int) -> np.ndarray:
        arr = arrays.get(name)
        if arr is None:
            batches[name] = alloc((n, *shape))
            arr = arrays[name] = batches[name].numpy()
        return arr[k]

    items = DecodedItems()
    for k, i in enumerate(indices):
        sample = tier.sample(*source.locate(int(i)), out=lambda name, k=k: slot(name, k))
        for name, value in list(sample.items()):
            if not (isinstance(value, torch.Tensor) and tier.decode.is_image(name)):
                continue
            dst = slot(name, k)
            if value.data_ptr() == dst.ctypes.data:
                continue  # copied into its slot by the tier
            hwc = value.permute(1, 2, 0) if dataset.decoder.layout == "CHW" else value
            if tuple(hwc.shape) == dst.shape:  # else left as it is: the collate names it
                np.copyto(dst, hwc.numpy())
                sample[name] = tier.decode.output(dst)
        items.append(sample)
    items.batches = batches
    return items


def _pinned(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=True)


class PixelBatcher:
    """Builds a :class:`~fastload.ShardedDataset`'s batches from its pixel tier in the
    loader's process (see the module docstring). ``pin``: batch tensors allocated
    pinned and the other tensors pinned (needs CUDA); else from the process's slabs.
    ``device``: the loader's CUDA device (the thread allocates under it)."""

    def __init__(self, dataset: Any, *, pin: bool = False, device: Any = None) -> None:
        self.dataset = dataset
        self.pin = pin
        self.device = device
        #: the process's pool of slabs, recycled when the caller drops a batch
        self.slabs: SlabPool = shared_pool()
        self.batches = 0  # batches built (all epochs)

    def epoch(self, sampler: Any, batch_size: int, drop_last: bool) -> Iterator[Any] | None:
        """The rest of the epoch ``sampler`` (the loader's
        :class:`~fastload.loader.sampler.ResumableSampler`, set to the epoch and its
        resume point) yields, in batches as torch's ``BatchSampler`` cuts them, when
        every one of its indices is in the tier; None when one is not (the workers
        then run the epoch)."""
        if sampler is None:
            return None
        indices = sampler.rank_indices()
        if self.dataset.pixels.missing(indices).size:
            return None
        cuts = range(0, len(indices), batch_size)
        plan = [indices[s : s + batch_size].tolist() for s in cuts]
        if plan and drop_last and len(plan[-1]) < batch_size:
            plan.pop()
        return self.iterate(plan)

    def build(self, indices: Sequence[int]) -> Any:
        """One batch: the collated samples ``indices`` (see :func:`read_pixel_batch`)."""
        items = read_pixel_batch(self.dataset, indices, _pinned if self.pin else self.slabs.array)
        batch = collate_decoded(items)
        if self.pin:  # what torch's pin-memory thread does to the workers' batches
            for name, value in batch.items():
                if callable(getattr(value, "pin_memory", None)) and not value.is_pinned():
                    batch[name] = value.pin_memory()
        self.batches += 1
        return batch

    def _thread_device(self) -> None:
        dev = self.device
        if dev is not None and getattr(dev, "type", None) == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)

    def iterate(self, plan: Sequence[Sequence[int]]) -> Iterator[Any]:
        """The batches of ``plan`` (index lists) in order, built on one background thread
        :data:`PIXEL_DEPTH` batches ahead of the caller; the thread ends with the
        iteration (finished, abandoned, closed or collected)."""
        pool = ThreadPoolExecutor(
            1, thread_name_prefix="fastload-pixels", initializer=self._thread_device
        )
        pending: deque[Future[Any]] = deque()
        join = True
        try:
            todo = iter(plan)
            while True:
                while len(pending) < PIXEL_DEPTH + 1:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    pending.append(pool.submit(self.build, nxt))
                if not pending:
                    return
                fut = pending.popleft()
                while not fut.done():  # short slices: a Ctrl-C reaches this thread
                    wait([fut], timeout=0.2)
                yield fut.result()
        except KeyboardInterrupt:
            join = False  # the caller's Ctrl-C goes up now
            raise
        finally:
            for fut in pending:
                fut.cancel()
            if not sys.is_finalizing():  # a generator collected at exit: threads are gone
                pool.shutdown(wait=join, cancel_futures=True)
