"""The thin datasets :class:`~fastload.DataLoader` hands torch's loader in place of
the caller's, one per kind of dataset and batch transport.

* :class:`IterableAdapter`, for every ``IterableDataset``: carries the loader's
  (epoch, resume point) and the dataset's ``loader_state()`` into the iterating
  process through shared memory, so they also reach persistent workers; yields
  :class:`~fastload.datasets.source.SampleRef` records in the batch transport.
* :class:`RefMapAdapter`, for a map-style fastload dataset in the batch transport:
  items are ``SampleRef`` records, not samples.
* :class:`DecodeBatchAdapter`, for a map-style fastload dataset decoding images of
  one fixed shape in worker processes: whole batches decoded into shared memory.
* :class:`PixelBatchAdapter`, for a map-style fastload dataset whose batches are
  stacks of its pixel tier's images, under worker processes: whole batches copied
  from the pixel shards into shared memory.
* :class:`MapStatsAdapter` (:class:`BatchedMapStatsAdapter` for a dataset with a
  batched ``__getitems__``), for a map-style dataset with I/O counters under worker
  processes: each worker's copy publishes its counters.

Every adapter keeps the caller's dataset as ``.dataset`` (what
``get_worker_info().dataset.dataset`` reads in a worker). :func:`adapt` picks one;
:func:`stop_persistent_workers` ends the worker processes torch keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from fastload.errors import ConfigError
from fastload.loader.decoded import decode_batch, fixed_image_shape
from fastload.loader.pixel_batches import read_pixel_batch
from fastload.loader.state import ResumableIterable
from fastload.loader.stats import WorkerCounters, io_source
from fastload.loader.transport import shared_batch
from fastload.loader.transport_plan import builds_items, cache_able

__all__ = [
    "STATE_BYTES",
    "BatchedMapStatsAdapter",
    "DecodeBatchAdapter",
    "IterableAdapter",
    "MapStatsAdapter",
    "PixelBatchAdapter",
    "RefMapAdapter",
    "adapt",
    "decodes_batches",
    "stop_persistent_workers",
]

#: Room for a dataset's loader_state() JSON on its way to the workers.
STATE_BYTES = 16384


class IterableAdapter(torch.utils.data.IterableDataset[Any]):
    """Carries the loader's (epoch, resume point) into the iterating process through a
    shared-memory tensor, so it also reaches persistent workers, and publishes the
    dataset's I/O counters from workers."""

    def __init__(self, dataset: Any, counters: WorkerCounters | None, refs: bool = False) -> None:
        self.dataset = dataset
        self.counters = counters
        self.refs = refs  # yield SampleRef records (the batch transport)
        # epoch, batch_size, drop_last, samples_consumed, bytes of the dataset's state
        self.control = torch.zeros(5, dtype=torch.int64).share_memory_()
        # the dataset's loader_state() as JSON (seed, layout, ...): persistent workers
        # keep their copy of the dataset, so every part of a loaded state travels here
        self.state_json = torch.zeros(STATE_BYTES, dtype=torch.uint8).share_memory_()

    def publish(self, epoch: int, batch_size: int, drop_last: bool, consumed: int) -> None:
        """Set what the next ``iter()`` in any process (persistent workers too) starts
        from: the loader's position and the dataset's :meth:`loader_state`."""
        nbytes = 0
        if isinstance(self.dataset, ResumableIterable):
            blob = json.dumps(self.dataset.loader_state()).encode()
            if len(blob) > STATE_BYTES:
                raise ConfigError(
                    f"fastload.DataLoader: the dataset's loader_state() is {len(blob)} bytes "
                    f"of JSON; at most {STATE_BYTES} reach the workers"
                )
            self.state_json[: len(blob)].copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
            nbytes = len(blob)
        self.control.copy_(
            torch.tensor([epoch, batch_size, int(drop_last), consumed, nbytes], dtype=torch.int64)
        )

    def __iter__(self) -> Iterator[Any]:
        epoch, batch_size, drop_last, consumed, nbytes = (int(v) for v in self.control.tolist())
        inner = self.dataset
        if isinstance(inner, ResumableIterable):
            inner.set_epoch(epoch)
            if nbytes:
                inner.load_loader_state(json.loads(self.state_json[:nbytes].numpy().tobytes()))
            inner.configure(
                batch_size=batch_size, drop_last=bool(drop_last), samples_consumed=consumed
            )
        elif callable(getattr(inner, "set_epoch", None)):
            inner.set_epoch(epoch)
        info = torch.utils.data.get_worker_info()
        counters = self.counters if info is not None else None
        io = io_source(inner)
        if counters is not None:
            counters.start(io.io_stats())
        items = inner.iter_refs() if self.refs else iter(inner)
        for item in items:
            if counters is not None:
                counters.publish(info.id, io.io_stats())  # type: ignore[union-attr]
            yield item


class MapStatsAdapter(torch.utils.data.Dataset[Any]):
    """A map-style dataset whose worker copies publish their I/O counters."""

    def __init__(self, dataset: Any, counters: WorkerCounters | None) -> None:
        self.dataset = dataset
        self.counters = counters

    def __len__(self) -> int:
        return len(self.dataset)

    def _start(self) -> None:
        counters = self.counters
        in_worker = torch.utils.data.get_worker_info() is not None
        if counters is not None and not counters.started and in_worker:
            counters.start(io_source(self.dataset).io_stats())

    def _publish(self) -> None:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.counters is not None:
            self.counters.publish(info.id, io_source(self.dataset).io_stats())

    def __getitem__(self, index: int) -> Any:
        self._start()
        item = self.dataset[index]
        self._publish()
        return item


class RefMapAdapter(MapStatsAdapter):
    """A map-style fastload dataset in the batch transport: items are
    :class:`~fastload.datasets.source.SampleRef` records (workers publish counters)."""

    def __getitem__(self, index: int) -> Any:
        self._start()
        ref = self.dataset.source.ref(int(index))
        self._publish()
        return ref

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self._start()
        source = self.dataset.source
        refs = [source.ref(int(i)) for i in indices]
        self._publish()
        return refs


class BatchedMapStatsAdapter(MapStatsAdapter):
    """As :class:`MapStatsAdapter`, keeping the dataset's batched ``__getitems__``."""

    def __getitems__(self, indices: list[int]) -> Any:
        self._start()
        items = self.dataset.__getitems__(indices)
        self._publish()
        return items


class DecodeBatchAdapter(MapStatsAdapter):
    """A fastload map-style dataset whose images decode to one fixed shape, under
    worker processes: each batch is read and decoded whole, every image straight into
    its slot of a shared-memory batch tensor (:mod:`fastload.loader.decoded`)."""

    #: the loader's :class:`~fastload.loader.worker_slabs.SlabChannel`, when the
    #: worker's batch tensors are recycled slabs
    slabs: Any = None

    def use_slabs(self, channel: Any) -> None:
        """Carve the batch tensors from ``channel``'s recycled slabs."""
        self.slabs = channel

    def _alloc(self) -> Any:
        if self.slabs is None:
            return shared_batch
        self.slabs.begin()
        return self.slabs.alloc

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self._start()
        source = self.dataset.source
        samples = [source.read(int(i)) for i in indices]
        items = decode_batch(samples, self.dataset.decoder, self._alloc())
        self._publish()
        return items


class PixelBatchAdapter(DecodeBatchAdapter):
    """A map-style dataset served by the pixel tier whose batches are stacks of its
    pixels (:func:`~fastload.loader.pixel_batches.serves_pixel_batches`), under worker
    processes (a filling epoch): each batch is read whole, every stored image copied
    from its pixel shard straight into its slot of a shared-memory batch tensor (a new
    one decoded, then copied there)."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        self._start()
        items = read_pixel_batch(self.dataset, indices, self._alloc())
        self._publish()
        return items


def decodes_batches(dataset: Any) -> bool:
    """Whether worker processes decode ``dataset``'s batches whole into shared memory
    (:class:`DecodeBatchAdapter`): a fastload dataset that makes its items from its
    source with its own decoder, no transform, images of one fixed shape."""
    return (
        cache_able(dataset)
        and not builds_items(dataset)
        and getattr(dataset, "transform", None) is None
        # a decoded-pixel tier serves items without decoding: its __getitem__ decides
        and getattr(dataset, "pixels", None) is None
        and fixed_image_shape(getattr(dataset, "decoder", None)) is not None
    )


def adapt(
    dataset: Any, *, iterable: bool, refs: bool, counted: bool, pixels: bool = False
) -> IterableAdapter | MapStatsAdapter | None:
    """The adapter torch's loader gets in place of ``dataset``, or None when it gets
    ``dataset`` itself (a map-style dataset without counters to publish from worker
    processes). ``refs``: the batch transport (items are ``SampleRef`` records);
    ``counted``: the dataset has I/O counters and worker processes run; ``pixels``:
    batches are stacks of the pixel tier's images (the plan's ``pixel_batches``)."""
    if iterable:
        return IterableAdapter(dataset, None, refs=refs)
    if refs:
        return RefMapAdapter(dataset, None)
    if counted and pixels:
        return PixelBatchAdapter(dataset, None)
    if counted and decodes_batches(dataset):
        return DecodeBatchAdapter(dataset, None)
    if counted:
        batched = callable(getattr(dataset, "__getitems__", None))
        return (BatchedMapStatsAdapter if batched else MapStatsAdapter)(dataset, None)
    return None


def stop_persistent_workers(loader: torch.utils.data.DataLoader[Any] | None) -> None:
    """End the persistent-workers iterator torch keeps on ``loader`` (and its worker
    processes), which it would otherwise keep until the loader is collected."""
    it = getattr(loader, "_iterator", None)
    if it is None:
        return
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    loader._iterator = None  # type: ignore[union-attr]
