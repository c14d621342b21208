"""``fastload.DataLoader``: torch's DataLoader, composed with exact resume, device
feeding and statistics.

The wrapper builds a ``torch.utils.data.DataLoader`` and drives it; it does not
subclass or copy torch's code. What it adds:

* **Order and resume.** For map-style datasets it brings its own
  :class:`~fastload.loader.sampler.ResumableSampler` (a permutation by seed and
  epoch, split over ranks with equal counts). For iterable datasets it passes the
  epoch and the resume point to the dataset through :class:`ResumableIterable`.
  The state is ``(epoch, batches consumed)``, counted as batches handed to the
  caller, never those prefetched by workers, so it is the same on every rank of a
  synchronised job.
* **Device feeding** (``device=``): batches are pinned and copied to the device on
  a side stream one batch ahead (:mod:`fastload.loader.device`).
* **Statistics** (:meth:`DataLoader.stats`): per-batch waits measured in the main
  process and the dataset's I/O counters summed over workers
  (:mod:`fastload.loader.stats`).
* **The batch transport** (``transport="cache"``, the default for fastload's own
  datasets): workers send where each batch's bytes are in the node-local cache, and
  the loader's process copies them once out of its own mapping into one packed
  buffer per field, or decodes them in a thread pool straight into a channels-last
  batch tensor (:mod:`fastload.loader.transport`). No sample bytes are pickled.
  ``transport="pickle"`` is torch's own path (workers build and pickle batches).

Iteration continues where the state says: a new loader starts at epoch 0, batch 0;
after a ``break`` (or :meth:`DataLoader.load_state_dict`), the next ``iter()``
yields the rest of the same epoch; after the last batch of an epoch the state moves
to the start of the next epoch. ``set_epoch(e)`` with a different epoch restarts at
batch 0 of ``e``; with the current epoch it keeps the resume point, so the usual
``for epoch in range(start, n): loader.set_epoch(epoch)`` loop resumes correctly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.utils.data

from fastload.datasets.options import NvjpegDecode
from fastload.errors import ConfigError
from fastload.loader.device import DevicePrefetcher, PoolStats, first_tensor, make_copy_stream
from fastload.loader.sampler import (
    RankLayout,
    ResumableSampler,
    detect_rank_layout,
    per_rank_count,
)
from fastload.loader.shared_tier import make_shared_tier_dir, remove_shared_tier_dir
from fastload.loader.stats import LoaderStats, WaitRecorder, WorkerCounters, has_io_stats
from fastload.loader.token_batches import token_batcher
from fastload.loader.transport import BatchBuilder, PlanPrefetcher, collate_decoded, collate_refs

TRANSPORTS = ("auto", "cache", "pickle")

__all__ = ["STATE_VERSION", "DataLoader", "ResumableIterable"]

STATE_VERSION = 1

# torch arguments the wrapper decides itself (order and batching must stay resumable)
_OWNED_TORCH_ARGS = ("sampler", "batch_sampler", "shuffle", "dataset")


@runtime_checkable
class ResumableIterable(Protocol):
    """What an ``IterableDataset`` implements to be resumable by :class:`DataLoader`.

    The loader calls, in the process that iterates (each worker, or the main
    process when ``num_workers == 0``), before every ``iter(dataset)``:
    ``set_epoch(epoch)`` then ``configure(batch_size=, drop_last=,
    samples_consumed=)``. ``samples_consumed`` is *global*: batches the caller
    consumed times the global batch size (per-rank batch size x ranks). The dataset
    then yields this rank's sequence for the epoch from that point on, split over
    DataLoader workers by batch, round-robin: worker ``w`` of ``W`` yields the
    samples of the rank's batches ``j`` with ``j % W == w`` (whole batches of
    ``batch_size``), so torch's round-robin over workers reproduces the rank's
    sequence exactly. Every rank must yield the same number of batches.

    ``len(dataset)``, when defined, is the number of samples this rank yields per
    epoch (all workers together); the loader then knows its ``len``.

    ``loader_state()`` returns a small JSON-serialisable dict (seed, the canonical
    layout, ...) that the loader stores under ``"dataset"`` in its state; the loader
    asks its own copy after setting it to what the caller consumed.
    ``load_loader_state(state)`` restores it and raises
    :class:`~fastload.errors.ConfigError` if the state does not fit the dataset; the
    loader also calls it in the iterating process before every ``iter()`` (after
    ``set_epoch``, before ``configure``) with its own copy's state, so a state loaded
    into a running loader reaches persistent workers whole.
    """

    def set_epoch(self, epoch: int) -> None: ...

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None: ...

    def loader_state(self) -> dict[str, Any]: ...

    def load_loader_state(self, state: dict[str, Any]) -> None: ...


class _IterableAdapter(torch.utils.data.IterableDataset[Any]):
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
        self.state_json = torch.zeros(_STATE_BYTES, dtype=torch.uint8).share_memory_()

    def publish(self, epoch: int, batch_size: int, drop_last: bool, consumed: int) -> None:
        """Set what the next ``iter()`` in any process (persistent workers too) starts
        from: the loader's position and the dataset's :meth:`loader_state`."""
        nbytes = 0
        if isinstance(self.dataset, ResumableIterable):
            blob = json.dumps(self.dataset.loader_state()).encode()
            if len(blob) > _STATE_BYTES:
                raise ConfigError(
                    f"fastload.DataLoader: the dataset's loader_state() is {len(blob)} bytes "
                    f"of JSON; at most {_STATE_BYTES} reach the workers"
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
        if counters is not None:
            counters.start(inner.io_stats())
        items = inner.iter_refs() if self.refs else iter(inner)
        for item in items:
            if counters is not None:
                counters.publish(info.id, inner.io_stats())  # type: ignore[union-attr]
            yield item


class _MapStatsAdapter(torch.utils.data.Dataset[Any]):
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
            counters.start(self.dataset.io_stats())

    def _publish(self) -> None:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.counters is not None:
            self.counters.publish(info.id, self.dataset.io_stats())

    def __getitem__(self, index: int) -> Any:
        self._start()
        item = self.dataset[index]
        self._publish()
        return item


class _RefMapAdapter(_MapStatsAdapter):
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


class _BatchedMapStatsAdapter(_MapStatsAdapter):
    """As :class:`_MapStatsAdapter`, keeping the dataset's batched ``__getitems__``."""

    def __getitems__(self, indices: list[int]) -> Any:
        self._start()
        items = self.dataset.__getitems__(indices)
        self._publish()
        return items


def _count_samples(batch: Any, default: int) -> int:
    first = first_tensor(batch)
    if first is not None and first.ndim > 0:
        return int(first.shape[0])
    if isinstance(batch, Mapping) and batch:
        head = next(iter(batch.values()))
        if isinstance(head, Sequence) and not isinstance(head, (str, bytes)):
            return len(head)
    return default


#: Batches built ahead of the caller by the batch transport's builder thread.
_BUILD_DEPTH = 2
#: Room for a dataset's loader_state() JSON on its way to the workers.
_STATE_BYTES = 16384


#: The cache settings of the sources a loader moved onto its shared tier, as they were
#: given: restored by the end of the last loader whose tier the source reads from.
_LENT: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _end_shared_tier(source: Any, path: str, owner_pid: int, lease: int) -> None:
    """A loader's end (``close()``, collection, exit) in the process that made its
    shared tier: if ``source`` still reads from it, close what it has open there and
    give it back its own settings (so the dataset, used alone or by a later loader,
    does not recreate the removed directory), then remove the tier."""
    if os.getpid() == owner_pid and source.cache_dir == path:
        source.close()
        original = _LENT.pop(source, None)
        if original is not None:
            source.__setstate__(original)  # its settings and fresh per-process state
    remove_shared_tier_dir(path, owner_pid, lease)


def _default_decode_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _builtin_decoder(decoder: Any) -> bool:
    from fastload.decode import Decoder

    return decoder is None or isinstance(decoder, (Decoder, NvjpegDecode))


def _choose_transport(dataset: Any, asked: str, num_workers: int = 0) -> str:
    """``"cache"`` or ``"pickle"``: see :class:`DataLoader`'s ``transport``."""
    able = bool(getattr(dataset, "batch_transport", False)) and hasattr(dataset, "source")
    if asked == "pickle":
        return "pickle"
    if asked == "cache":
        if not able:
            raise ConfigError(
                f"fastload.DataLoader: transport='cache' needs a fastload ShardedDataset or "
                f"StreamingDataset (items made from shards); {type(dataset).__name__} makes "
                "its own items: use transport='pickle'"
            )
        return "cache"
    decoder = getattr(dataset, "decoder", None)
    simple = getattr(dataset, "transform", None) is None and _builtin_decoder(decoder)
    if simple and num_workers > 0 and _cpu_decoder(decoder):
        # measured (benchmarks/bench_transport.py --only decode): decoding in worker
        # processes beat the loader's decode threads (0.89x paired, 0.96x per CPU
        # second for threads): the Python around each Pillow call holds the GIL
        return "pickle"
    return "cache" if able and simple else "pickle"


def _cpu_decoder(decoder: Any) -> bool:
    from fastload.decode import Decoder

    return isinstance(decoder, Decoder) and decoder.image is not None


def _loader_decoder(dataset: Any) -> Any:
    decoder = getattr(dataset, "decoder", None)
    transform = getattr(dataset, "transform", None)
    if transform is None:
        return decoder
    from fastload.datasets.options import finish

    return functools.partial(finish, decoder=decoder, transform=transform)


class DataLoader:
    """A ``torch.utils.data.DataLoader`` with exact resume, device feeding and stats.

    ``dataset``: map-style (``__getitem__``/``__len__``: the loader shuffles by
    ``seed`` and epoch and splits over ``world``, default ``World.detect()``) or an
    ``IterableDataset`` (which orders and splits itself; resumable if it implements
    :class:`ResumableIterable`). ``drop_last``: drop the tail of the partition and
    the last incomplete batch; otherwise the partition is padded by wrapping around
    so every rank gets the same number of batches. ``device``: deliver batches on
    this device (see :mod:`fastload.loader.device`): tensors and the packed bytes of
    raw fields (:class:`~fastload.packed.PackedBytes`) move; ``str``, ``bytes`` and
    other Python objects in a batch (keys, lists of bytes from ``transport="pickle"``
    with a list collate) stay on the host as they are. ``pin_memory``: stage through
    pinned memory (default: when ``device`` is CUDA). Other arguments and
    ``torch_kwargs`` go to torch's DataLoader.

    ``transport``: ``"auto"`` (default) builds batches of fastload's own datasets
    (``ShardedDataset``, ``StreamingDataset``) in this process from the node-local
    cache (see :mod:`fastload.loader.transport`) when they have no ``transform`` and
    do not decode (or decode with ``"nvjpeg"``, or have no workers to decode in);
    with workers, built-in CPU decoding stays in them (measured faster than threads)
    and their batches are stacked channels-last in shared memory
    (:func:`~fastload.loader.transport.collate_decoded`). ``"cache"`` insists on the
    cache transport (decoding and a ``transform`` then run in the decode threads);
    ``"pickle"`` is torch's path, workers building and pickling whole batches. With
    the cache transport, raw fields arrive as one :class:`~fastload.packed.PackedBytes`
    per field (``"__key__"`` a list of str), decoded images as one channels-last uint8
    tensor, and a
    ``collate_fn`` receives the samples as the dataset would return them. A batch
    owns its memory (a copy out of the cache): it stays valid as long as it is kept.
    ``decode_threads`` decode in this process (default: one per CPU core, at most
    8). ``plan_in_workers``: whether worker processes plan the cache transport's
    batches (default: only when they also decode; raw batches are planned and built
    by this process's builder thread, and ``num_workers`` starts no process for
    them, since planning costs ~20 µs a sample and worker processes measured slower);
    :attr:`worker_processes` says how many run. A dataset without ``cache_dir``
    under worker processes gets a private tier in shared memory for the loader's
    lifetime (:mod:`fastload.loader.shared_tier`), so each
    shard is fetched once, not once per worker. :attr:`transport` says which ran.

    A ``TokenDataset`` (or ``ParquetDataset(tokenizer=...)``) with the default
    collate (or ``collate_packed``) and a transport other than ``"pickle"`` starts no
    worker process either (unless ``plan_in_workers=True``): this process slices each
    batch's windows out of the mapped shards into one int64 buffer, the same batches
    as torch's path (:mod:`fastload.loader.token_batches`);
    :attr:`transport` then reads ``"cache"``.

    In worker processes ``get_worker_info().dataset`` may be the loader's thin
    wrapper; its ``.dataset`` attribute is the dataset passed here.

    The positional arguments are torch's, in torch's order (``dataset, batch_size,
    shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last,
    timeout, worker_init_fn, multiprocessing_context, generator``); ``seed``,
    ``device``, ``world`` and the others are keyword-only. torch's attributes
    (``dataset``, ``batch_size``, ``sampler``, ``batch_sampler``, ``drop_last``,
    ``num_workers``, ``collate_fn``, ``pin_memory``, ``timeout``, ...) read as torch's
    do. A ``fastload.World`` given as ``world`` also becomes the world of a
    ``StreamingDataset`` that has none.

    Raises :class:`ConfigError` for arguments the wrapper decides itself
    (``sampler``, ``batch_sampler``, ``in_order=False``), for ``shuffle`` with an
    iterable dataset, and for bad sizes.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        seed: int = 0,
        device: str | torch.device | None = None,
        world: Any = None,
        transport: str = "auto",
        decode_threads: int | None = None,
        plan_in_workers: bool | None = None,
        **torch_kwargs: Any,
    ) -> None:
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ConfigError(
                    f"fastload.DataLoader: '{name}' is decided by the loader (it keeps the "
                    "order resumable and splits it over ranks itself); use shuffle=, seed= "
                    "and world= instead (Lightning: use_distributed_sampler=False)"
                )
        for name in _OWNED_TORCH_ARGS:
            if name in torch_kwargs:
                raise ConfigError(
                    f"fastload.DataLoader: '{name}' is decided by the loader (it keeps the "
                    "order resumable); use shuffle=, seed= and world= instead"
                )
        if torch_kwargs.get("in_order", True) is False:
            raise ConfigError("fastload.DataLoader: in_order=False would make resume inexact")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"fastload.DataLoader: batch_size must be >= 1, got {batch_size!r}")
        if num_workers < 0:
            raise ConfigError(f"fastload.DataLoader: num_workers must be >= 0, got {num_workers}")
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"fastload.DataLoader: transport must be one of {TRANSPORTS}, got {transport!r}"
            )
        if decode_threads is not None and decode_threads < 1:
            raise ConfigError(
                f"fastload.DataLoader: decode_threads must be >= 1, got {decode_threads}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.layout: RankLayout = detect_rank_layout(world)
        from fastload.sampling.world import World

        if isinstance(world, World) and getattr(dataset, "world", False) is None:
            dataset.world = world  # a StreamingDataset plans for the loader's world
        self.device = torch.device(device) if device is not None else None
        self._iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if self._iterable and shuffle:
            raise ConfigError(
                "fastload.DataLoader: an iterable dataset orders itself; set shuffling on the "
                "dataset (e.g. StreamingDataset(shuffle=True)), not on the loader"
            )
        is_cuda = self.device is not None and self.device.type == "cuda"
        pin = is_cuda if pin_memory is None else bool(pin_memory)
        self.pin_memory = pin
        # With workers, torch's pin-memory thread pins off the main thread and its
        # caching host allocator recycles pinned blocks safely; without workers torch
        # would pin synchronously anyway, so the loader's own bounded pool stages
        # (see docs/loader-sync.md).
        self._torch_pins = pin and (self.device is None or (is_cuda and num_workers > 0))
        self._stage = pin and not self._torch_pins
        self._prefetcher: DevicePrefetcher | None = None
        # TokenDataset windows, default collate: whole batches sliced from the mapped
        # shards in this process, no worker process (loader/token_batches.py)
        self._tokens = token_batcher(dataset, transport, collate_fn, plan_in_workers)
        self.transport = (
            _choose_transport(dataset, transport, num_workers) if self._tokens is None else "cache"
        )
        self._builder: BatchBuilder | None = None
        self._plan_prefetch: PlanPrefetcher | None = None
        self._running: weakref.ref[Iterator[Any]] | None = None  # the latest iterator
        self._shared_dir: str | None = None
        self._finalizer: Any = None
        self._procs = num_workers  # worker processes actually started
        if self._tokens is not None:
            self._procs = 0
            self._tokens.pin = bool(pin and is_cuda and torch.cuda.is_available())
            self._tokens.device = self.device if is_cuda else None
            self._torch_pins, self._stage = False, pin and not self._tokens.pin
        elif self.transport == "cache":
            source = dataset.source
            decoder: Any = _loader_decoder(dataset)
            batch_decoder: Any = None
            if isinstance(decoder, NvjpegDecode) and collate_fn is None:
                # raw JPEG bytes packed (pinned), decoded whole on the loader's device
                batch_decoder = decoder.batch_decoder(self.device)
                decoder = None
            if plan_in_workers is False or (plan_in_workers is None and decoder is None):
                # raw batches: planning costs ~20 us a sample and the copy happens here
                # anyway, so worker processes only add start-up and contention
                # (measured: 0 workers 1.7x 2 workers on 2 cores, docs/benchmarks.md)
                self._procs = 0
            lent = source in _LENT  # it reads from an earlier loader's shared tier
            if self._procs > 0 and (source.cache_dir is None or lent):
                # one RAM-backed tier for the loader's processes (see shared_tier); a
                # dataset an earlier loader (still alive: `loader = DataLoader(...)`
                # each epoch) lent its tier to gets this loader's own
                limit = int(source.cache_config.ram_limit)
                need = min(limit, int(source.manifest.total_bytes))
                self._shared_dir, lease = make_shared_tier_dir(need)
                if not lent:
                    _LENT[source] = source.__getstate__()  # its settings, as given
                source.use_cache_dir(self._shared_dir, limit)
                self._finalizer = weakref.finalize(
                    self, _end_shared_tier, source, self._shared_dir, os.getpid(), lease
                )
            builder_pin = bool(pin and is_cuda and torch.cuda.is_available())
            self._builder = BatchBuilder(
                source,
                decoder=decoder,
                collate_fn=collate_fn,
                threads=decode_threads or _default_decode_threads(),
                pin=builder_pin,
                batch_decoder=batch_decoder,
                device=self.device if is_cuda else None,
            )
            # the batches are built here, already pinned when feeding CUDA
            self._torch_pins = False
            self._stage = pin and not builder_pin
            collate_fn = collate_refs
        elif collate_fn is None and _cpu_decoder(getattr(dataset, "decoder", None)):
            # decoded in the workers: stacked channels-last there, in shared memory
            collate_fn = collate_decoded
        elif collate_fn is None:
            # torch's default_collate, after a check that names the field and the sizes
            # when arrays of different shapes meet (torch's own error does not)
            from fastload.datasets.collate import default_collate

            collate_fn = default_collate

        self._stats_keys: tuple[str, ...] = ()
        self._io_base: dict[str, float] = {}
        if has_io_stats(dataset):
            # counters since the loader was made: the main process's copy may have been used
            self._io_base = {k: float(v) for k, v in dataset.io_stats().items()}
            self._stats_keys = tuple(sorted(self._io_base))
        self._counters: list[WorkerCounters] = []  # live worker generations
        self._retired: dict[str, float] = {}  # counters of finished generations
        self._persistent = persistent_workers and self._procs > 0

        self._sampler: ResumableSampler | None = None
        self._map_adapter: _MapStatsAdapter
        wrapped: Any
        refs = self.transport == "cache" and self._tokens is None
        if self._iterable:
            wrapped = self._iter_adapter = _IterableAdapter(dataset, None, refs=refs)
            if isinstance(dataset, ResumableIterable):
                # so that len(dataset) (this rank's samples per epoch) counts in the
                # loader's batches, also in the main process, which never iterates it
                dataset.configure(batch_size=batch_size, drop_last=drop_last, samples_consumed=0)
        else:
            self._sampler = ResumableSampler(
                len(dataset),
                shuffle=shuffle,
                seed=seed,
                layout=self.layout,
                drop_last=drop_last,
            )
            wrapped = dataset
            if refs:
                wrapped = self._map_adapter = _RefMapAdapter(dataset, None)
            elif self._stats_keys and self._procs > 0:
                cls = (
                    _BatchedMapStatsAdapter
                    if callable(getattr(dataset, "__getitems__", None))
                    else _MapStatsAdapter
                )
                wrapped = self._map_adapter = cls(dataset, None)
        kwargs: dict[str, Any] = dict(torch_kwargs)
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        for name, value in (
            ("worker_init_fn", worker_init_fn),
            ("multiprocessing_context", multiprocessing_context),
            ("generator", generator),
        ):
            if value is not None:
                kwargs[name] = value
        if self._procs == 0 and num_workers > 0:
            # settings of worker processes that are not started (torch refuses them)
            kwargs.pop("prefetch_factor", None)
            unused = [
                name
                for name in ("worker_init_fn", "multiprocessing_context")
                if kwargs.pop(name, None) is not None
            ]
            if unused:
                warnings.warn(
                    f"fastload.DataLoader: {' and '.join(unused)} unused: these batches are "
                    f"built in the loader's own process and start no worker process "
                    f"(num_workers={num_workers}); pass plan_in_workers=True to start them",
                    UserWarning,
                    stacklevel=2,
                )
        self._torch_loader = torch.utils.data.DataLoader(
            wrapped,
            batch_size=batch_size,
            sampler=self._sampler,
            num_workers=self._procs,
            collate_fn=collate_fn,
            pin_memory=self._torch_pins,
            drop_last=drop_last,
            timeout=timeout if self._procs else 0,
            persistent_workers=self._persistent,
            **kwargs,
        )
        self._epoch = 0
        self._batches_consumed = 0
        self._generation = 0
        self._recorder = WaitRecorder()

    # ------------------------------------------- torch.utils.data.DataLoader's
    @property
    def sampler(self) -> Any:
        """The sampler torch's loader draws from: the loader's
        :class:`~fastload.loader.sampler.ResumableSampler` for a map-style dataset,
        torch's placeholder for an iterable one (which orders itself)."""
        return self._torch_loader.sampler

    @property
    def batch_sampler(self) -> Any:
        """torch's ``BatchSampler`` over :attr:`sampler` (None for an iterable
        dataset, which batches in its workers)."""
        return self._torch_loader.batch_sampler

    @property
    def timeout(self) -> float:
        """Seconds torch waits for a worker's batch (0: forever)."""
        return float(self._torch_loader.timeout)

    @property
    def worker_init_fn(self) -> Any:
        """Called in each worker process at its start, as in torch."""
        return self._torch_loader.worker_init_fn

    @property
    def multiprocessing_context(self) -> Any:
        """How worker processes start (None: the platform default)."""
        return self._torch_loader.multiprocessing_context

    @property
    def generator(self) -> Any:
        """The torch generator given (base seeds of the workers)."""
        return self._torch_loader.generator

    @property
    def prefetch_factor(self) -> int | None:
        """Batches each worker loads ahead."""
        return self._torch_loader.prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        """Whether the worker processes outlive an epoch."""
        return bool(self._torch_loader.persistent_workers)

    # ----------------------------------------------------------------- order
    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks: ``batch_size x world_size``."""
        return self.batch_size * self.layout.world_size

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def batches_consumed(self) -> int:
        """Batches of the current epoch handed to the caller."""
        return self._batches_consumed

    def _num_batches(self) -> int | None:
        if self._sampler is not None:
            samples = per_rank_count(self._sampler.length, self.layout.world_size, self.drop_last)
        else:
            try:
                samples = len(self.dataset)
            except TypeError:
                return None
        if self.drop_last:
            return samples // self.batch_size
        return -(-samples // self.batch_size)

    def __len__(self) -> int:
        """Batches per epoch on this rank. Raises TypeError for an iterable dataset
        without ``__len__``."""
        n = self._num_batches()
        if n is None:
            raise TypeError(f"{type(self.dataset).__name__} has no len(); neither has the loader")
        return n

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next: from batch 0 if it differs from the current
        epoch, from the resume point if it is the current one."""
        if epoch < 0:
            raise ConfigError(f"epoch must not be negative, got {epoch}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches_consumed = 0
            self._generation += 1  # an iterator of the old epoch must not continue

    def _advance_epoch(self) -> None:
        self._epoch += 1
        self._batches_consumed = 0

    # ------------------------------------------------------------- iteration
    def _prepare(self) -> WorkerCounters | None:
        n = self._num_batches()
        if n and self._batches_consumed >= n:
            self._advance_epoch()
        consumed = self._batches_consumed * self.global_batch_size
        if self._sampler is not None:
            self._sampler.set_epoch(self._epoch)
            self._sampler.set_start(min(consumed, self._sampler.total))
        else:
            if isinstance(self.dataset, ResumableIterable):
                # the loader's own copy follows too: its plan and len() are this epoch's
                self.dataset.set_epoch(self._epoch)
                self.dataset.configure(
                    batch_size=self.batch_size, drop_last=self.drop_last, samples_consumed=consumed
                )
            self._iter_adapter.publish(self._epoch, self.batch_size, self.drop_last, consumed)
        self._plan_prefetch = self._make_plan_prefetcher()
        if self._stats_keys and self._procs > 0 and (not self._persistent or not self._counters):
            # a new generation of worker processes gets fresh rows; old rows stay summed
            counters = WorkerCounters(self._stats_keys, self._procs)
            self._counters.append(counters)
            adapter = self._iter_adapter if self._iterable else self._map_adapter
            adapter.counters = counters
        return self._counters[-1] if self._counters else None

    def _make_plan_prefetcher(self) -> PlanPrefetcher | None:
        # the epoch's shards in order of first use, staged from this process ahead of
        # the workers (one schedule per rank; the tier's single flight makes it one
        # download per node)
        if self._builder is None:
            return None
        source = self.dataset.source
        ahead = int(source.cache_config.prefetch_shards)
        if getattr(self.dataset, "prefetch_shards", None) == 0 or not ahead:
            return None  # prefetching switched off on the dataset or its cache config
        if self._sampler is not None:
            indices = self._sampler.rank_indices()  # the array torch's sampler iterates
            shards = np.searchsorted(source._starts, indices, side="right") - 1
            _, first = np.unique(shards, return_index=True)
            first = np.sort(first)
            order, first_pos = shards[first], first
        else:
            order, first_pos = self.dataset.plan_shards()
        # the batches torch keeps in flight, plus the builder's: what is being read now
        prefetch = self._torch_loader.prefetch_factor or 2
        in_flight = max(1, self._procs) * prefetch + _BUILD_DEPTH
        return PlanPrefetcher(
            source,
            order.tolist(),
            ahead,
            first_batch=(np.asarray(first_pos) // self.batch_size).tolist(),
            batches_ahead=in_flight,
        )

    def _retire(self, counters: WorkerCounters) -> None:
        # torch has shut the generation's workers down: fold its final rows into
        # plain numbers and drop the shared memory (one segment per epoch otherwise)
        if counters in self._counters:
            self._counters.remove(counters)
            for k, v in counters.totals().items():
                self._retired[k] = self._retired.get(k, 0.0) + v

    def __iter__(self) -> Iterator[Any]:
        """Yield the rest of the current epoch's batches (on ``device`` if given).

        Starting a new iterator ends any older one of this loader: its next
        ``next()`` raises RuntimeError.
        """
        self._generation += 1
        generation = self._generation
        counters = self._prepare()
        dev = self.device
        if self._tokens is not None:
            source: Iterator[Any] = self._tokens.iterate(self.batch_size, self.drop_last)
        elif dev is not None and dev.type == "cuda" and dev.index is not None:
            # torch's pin-memory thread takes the current device when the iterator is
            # made: under the loader's device, not GPU 0, on every rank
            with torch.cuda.device(self.device):
                source = iter(self._torch_loader)
        else:
            source = iter(self._torch_loader)
        if self._builder is not None:
            source = self._build(source)
        if self.device is not None:
            if self._prefetcher is None:  # created lazily: no CUDA work in the constructor
                self._prefetcher = DevicePrefetcher(
                    make_copy_stream(self.device), stage=self._stage
                )
            source = self._prefetcher.iterate(source)
        it = self._consume(source, generation, counters)
        plan = self._plan_prefetch if self._builder is not None else None
        if plan is not None:
            # iter() started the plan's index threads; an iterator dropped before its
            # first batch never runs the generators' cleanup, so its collection stops
            # them (without joining: a collection may run on any thread)
            end = weakref.finalize(it, plan.close, False)
            end.atexit = False
        self._running = weakref.ref(it)
        return it

    def _build(self, refs: Iterator[Any]) -> Iterator[Any]:
        builder = self._builder
        assert builder is not None
        prefetch = self._plan_prefetch
        if prefetch is not None:
            prefetch.start()

        def noted() -> Iterator[Any]:
            try:
                for rb in refs:
                    if prefetch is not None:
                        prefetch.advance()
                    yield rb
            finally:
                if prefetch is not None:
                    prefetch.close()

        # without worker processes this process plans too: on a planner thread, one
        # batch ahead of the builder's copy
        return builder.iterate(noted(), depth=_BUILD_DEPTH, pull_in_thread=self._procs == 0)

    @property
    def worker_processes(self) -> int:
        """Worker processes this loader starts per iteration (see ``plan_in_workers``)."""
        return self._procs

    def close(self) -> None:
        """End a running iteration (its next ``next()`` raises StopIteration), stop
        this loader's threads and remove its shared RAM tier, if it made one (the
        threads also stop when an iteration ends or its iterator is collected; the
        tier goes when the loader is collected or the interpreter exits). The loader
        cannot iterate afterwards if it made a shared tier."""
        running = None if self._running is None else self._running()
        if running is not None and hasattr(running, "close"):
            with contextlib.suppress(ValueError):  # running in another thread right now
                running.close()  # its generators' cleanup: builder and index threads
        if self._plan_prefetch is not None:
            self._plan_prefetch.close()
        if self._builder is not None:
            self._builder.close()
        if self._tokens is not None:
            self._tokens.close()
        self._prefetcher = None
        self._stop_persistent_workers()
        if self._finalizer is not None:
            self._finalizer()

    def _stop_persistent_workers(self) -> None:
        # torch keeps a persistent-workers iterator (and its worker processes) on the
        # loader until the loader is collected; close() ends them now
        loader = getattr(self, "_torch_loader", None)
        it = getattr(loader, "_iterator", None)
        if it is None:
            return
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None  # type: ignore[union-attr]

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _consume(
        self, source: Iterator[Any], generation: int, counters: WorkerCounters | None
    ) -> Iterator[Any]:
        n = self._num_batches()
        last = time.perf_counter()
        advanced = False
        while True:
            if generation != self._generation:
                raise RuntimeError(
                    "this iterator of a fastload.DataLoader was superseded by a newer "
                    "iter(), set_epoch() or load_state_dict()"
                )
            asked = time.perf_counter()
            try:
                batch = next(source)
            except StopIteration:
                break
            except BaseException as e:
                if not self._persistent:
                    # the traceback's frames (ours, the prefetcher's, torch's) hold the
                    # torch iterator; clear their locals so its workers shut down now,
                    # not when the caller drops the exception
                    del source
                    traceback.clear_frames(e.__traceback__)
                raise
            got = time.perf_counter()
            self._recorder.record(got - asked, _count_samples(batch, self.batch_size))
            self._recorder.add_wall(got - last)
            last = got
            self._batches_consumed += 1
            if n is not None and self._batches_consumed >= n:
                self._advance_epoch()
                advanced = True
            yield batch
        if not advanced and generation == self._generation:
            self._advance_epoch()
        if counters is not None and not self._persistent:
            self._retire(counters)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The resume point as a small JSON-serialisable dict.

        It depends only on the epoch, the batches the caller consumed and the
        configuration, so every rank of a synchronised job returns the same dict.
        """
        epoch, consumed = self._epoch, self._batches_consumed
        n = self._num_batches()
        if n and consumed >= n:
            epoch, consumed = epoch + 1, 0
        dataset_state: dict[str, Any] = {}
        if isinstance(self.dataset, ResumableIterable):
            # this process's copy of the dataset, set to what the caller consumed (with
            # workers it never iterates), so its layout is the one the epoch runs on
            self.dataset.set_epoch(epoch)
            self.dataset.configure(
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                samples_consumed=consumed * self.global_batch_size,
            )
        if callable(getattr(self.dataset, "loader_state", None)):
            dataset_state = dict(self.dataset.loader_state())
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_consumed": consumed,
            "global_batch_size": self.global_batch_size,
            "batch_size": self.batch_size,
            "world_size": self.layout.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "dataset_length": None if self._iterable else len(self.dataset),
            "dataset": dataset_state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a :meth:`state_dict`: the next iteration yields the remaining
        batches of the saved epoch in the same order.

        The world size may differ if the global batch size is the same. Raises
        :class:`ConfigError` naming what differs (version, global batch size, dataset
        length, seed, shuffle, drop_last) or when the dataset cannot resume.
        """
        if not isinstance(state, Mapping):
            raise ConfigError(f"loader state must be a dict, got {type(state).__name__}")
        try:
            version = state["version"]
            epoch = int(state["epoch"])
            consumed = int(state["batches_consumed"])
            saved_global = int(state["global_batch_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"loader state is missing or has a bad field: {e!r}") from e
        if version != STATE_VERSION:
            raise ConfigError(
                f"loader state version {version!r} is not supported (expected {STATE_VERSION})"
            )
        if saved_global != self.global_batch_size:
            raise ConfigError(
                f"loader state was saved with global batch size {saved_global} "
                f"({state.get('batch_size')} per rank x {state.get('world_size')} ranks); this "
                f"loader's is {self.global_batch_size} ({self.batch_size} x "
                f"{self.layout.world_size}): the batch boundaries would not match"
            )
        mine: dict[str, Any] = {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "dataset_length": None if self._iterable else len(self.dataset),
        }
        for key, value in mine.items():
            if key in state and state[key] != value:
                what = "dataset length" if key == "dataset_length" else key
                raise ConfigError(
                    f"loader state was saved with {what} {state[key]!r}; this loader has "
                    f"{value!r}: the order would differ"
                )
        if epoch < 0 or consumed < 0:
            raise ConfigError(f"loader state has a negative epoch or count: {dict(state)!r}")
        n = self._num_batches()
        if n is not None and consumed > n:
            raise ConfigError(
                f"loader state has {consumed} batches consumed; an epoch here has only {n}"
            )
        dataset_state = state.get("dataset") or {}
        if callable(getattr(self.dataset, "load_loader_state", None)):
            self.dataset.load_loader_state(dict(dataset_state))
        elif self._iterable and consumed > 0:
            raise ConfigError(
                f"{type(self.dataset).__name__} does not implement "
                "fastload.loader.ResumableIterable; it cannot resume mid-epoch"
            )
        self._epoch = epoch
        self._batches_consumed = consumed
        self._generation += 1

    # ----------------------------------------------------------------- stats
    def io_stats(self) -> dict[str, float]:
        """The dataset's I/O counters summed over the main process and every worker."""
        if not self._stats_keys:
            return {}
        totals = {
            k: float(v) - self._io_base.get(k, 0.0) for k, v in self.dataset.io_stats().items()
        }
        for k, v in self._retired.items():
            totals[k] = totals.get(k, 0.0) + v
        for counters in self._counters:
            for k, v in counters.totals().items():
                totals[k] = totals.get(k, 0.0) + v
        return totals

    def stats(self) -> LoaderStats:
        """Waits, throughput and the dataset's I/O counters since the loader was made."""
        return LoaderStats.build(self._recorder, self.io_stats())

    def pool_stats(self) -> PoolStats | None:
        """Counters of the host staging pool, or None before device feeding started."""
        return None if self._prefetcher is None else self._prefetcher.pool.stats()
