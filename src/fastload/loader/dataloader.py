"""``fastload.DataLoader``: torch's DataLoader, composed with exact resume, device
feeding and statistics.

The wrapper builds a ``torch.utils.data.DataLoader`` and drives it; it does not
subclass or copy torch's code. What it adds:

* **Order and resume.** For map-style datasets it brings its own
  :class:`~fastload.loader.sampler.ResumableSampler` (a permutation by seed and
  epoch, split over ranks with equal counts), or iterates the caller's ``sampler`` /
  ``batch_sampler`` (:mod:`fastload.loader.samplers`). For iterable datasets it passes
  the epoch and the resume point to the dataset through :class:`ResumableIterable`.
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

The constructor checks its arguments and makes a
:class:`~fastload.loader.transport_plan.TransportPlan` (which transport, who builds
the batches, how many worker processes, and why), then builds from it: the adapter
torch's loader gets (:mod:`fastload.loader.adapters`), the batch builder or token
batcher and the shared tier (:mod:`fastload.loader.batchers`). The state format and
the resume arithmetic are :mod:`fastload.loader.state`.

Iteration continues where the state says: a new loader starts at epoch 0, batch 0;
after a ``break`` (or :meth:`DataLoader.load_state_dict`), the next ``iter()``
yields the rest of the same epoch; after the last batch of an epoch the state moves
to the start of the next epoch. ``set_epoch(e)`` with a different epoch restarts at
batch 0 of ``e``; with the current epoch it keeps the resume point, so the usual
``for epoch in range(start, n): loader.set_epoch(epoch)`` loop resumes correctly.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.utils.data

from fastload.errors import ConfigError
from fastload.loader.adapters import (
    IterableAdapter,
    MapStatsAdapter,
    adapt,
    stop_persistent_workers,
)
from fastload.loader.batchers import (
    BUILD_DEPTH,
    build_batchers,
    build_batches,
    collate_for,
    shard_prefetcher,
)
from fastload.loader.device import DevicePrefetcher, PoolStats, make_copy_stream
from fastload.loader.sampler import (
    RankLayout,
    ResumableSampler,
    detect_rank_layout,
    per_rank_count,
)
from fastload.loader.samplers import batching, caller_order, load_order_state, order_indices
from fastload.loader.shared_tier import is_lent
from fastload.loader.state import (
    STATE_VERSION,
    ResumableIterable,
    StateKey,
    count_batches,
    make_state,
    position_dataset,
    read_state,
    restore_dataset,
    rolled_over,
)
from fastload.loader.stats import (
    IOAccount,
    LoaderStats,
    WaitRecorder,
    WorkerCounters,
    count_samples,
)
from fastload.loader.token_batches import length_error, open_source
from fastload.loader.transport import PlanPrefetcher
from fastload.loader.transport_plan import (
    TRANSPORTS,
    TransportPlan,
    check_arguments,
    plan_transport,
    torch_arguments,
)
from fastload.loader.worker_slabs import slab_channel

__all__ = ["STATE_VERSION", "TRANSPORTS", "DataLoader", "ResumableIterable", "TransportPlan"]


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
    (:func:`~fastload.loader.transport.collate_decoded`), which each worker refills
    once nothing in this process refers to a batch any more
    (:mod:`fastload.loader.worker_slabs`; ``recycle_batches=False``: fresh memory per
    batch, for a caller that passes batches on to another process). ``"cache"``
    insists on the cache transport (decoding and a ``transform`` then run in the
    decode threads); ``"pickle"`` is torch's path, workers building and pickling whole
    batches. With
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
    shard is fetched once, not once per worker. :attr:`transport` says which ran,
    :attr:`transport_plan` what was decided and why.

    A ``TokenDataset`` (or ``ParquetTokenDataset``) with the default
    collate (or ``collate_packed``) and a transport other than ``"pickle"`` starts no
    worker process either (unless ``plan_in_workers=True``): this process slices each
    batch's windows out of the mapped shards into one int64 buffer, the same batches
    as torch's path (:mod:`fastload.loader.token_batches`);
    :attr:`transport` then reads ``"cache"``. Over ``ParquetTokenDataset(stream=True)``
    the unshuffled one-node first epoch's batches come while its first pass still
    tokenizes (``len()`` raises TypeError until it ends). An epoch of a
    ``ShardedDataset`` whose every sample is in its ``pixel_cache`` tier is built in
    this process, with no worker process, when its batch is a stack of those pixels
    (:mod:`fastload.loader.pixel_batches`).

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

    ``sampler`` / ``batch_sampler``: as torch's (a ``GroupedBatchSampler``, a
    ``DistributedSampler``: the sampler then splits over ranks); ``stats()`` counts the
    indices each batch had. Resume is exact in the same process for any sampler, from a
    state when the sampler's order is a function of its arguments and its epoch (kept
    in the state); otherwise the resumed ``iter()`` raises (:mod:`fastload.loader.samplers`).

    Raises :class:`ConfigError` where torch raises for ``sampler``/``batch_sampler``
    (mutually exclusive arguments, an iterable dataset), for ``in_order=False``, for
    ``shuffle`` with an iterable dataset, and for bad sizes.
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
        recycle_batches: bool = True,
        **torch_kwargs: Any,
    ) -> None:
        check_arguments(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=drop_last,
            num_workers=num_workers,
            transport=transport,
            decode_threads=decode_threads,
            torch_kwargs=torch_kwargs,
        )
        self.dataset = dataset
        self.batch_size: int | None = None if batch_sampler is not None else batch_size
        self._batch = batch_size if batch_sampler is None else 1
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.layout: RankLayout = detect_rank_layout(world)
        from fastload.sampling import World

        if isinstance(world, World) and getattr(dataset, "world", False) is None:
            dataset.world = world  # a StreamingDataset plans for the loader's world
        self.device = torch.device(device) if device is not None else None
        self._iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        plan = self.transport_plan = plan_transport(
            dataset,
            transport=transport,
            num_workers=num_workers,
            collate_fn=collate_fn,
            plan_in_workers=plan_in_workers,
            device=self.device,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            source_lent=is_lent(open_source(dataset)),
            caller_order=sampler is not None or batch_sampler is not None,
        )
        self.transport = plan.transport
        self.pin_memory = plan.pin_memory
        self._torch_pins, self._stage = plan.torch_pins, plan.stage
        self._procs = plan.worker_processes  # worker processes actually started
        self._persistent = plan.persistent_workers
        self._prefetcher: DevicePrefetcher | None = None
        self._plan_prefetch: PlanPrefetcher | None = None
        self._running: weakref.ref[Iterator[Any]] | None = None  # the latest iterator
        # what builds batches in this process: the token batcher, or the batch
        # transport's builder (and the shared tier its worker processes read through),
        # or the pixel batcher
        made = build_batchers(
            plan,
            dataset,
            owner=self,
            device=self.device,
            collate_fn=collate_fn,
            decode_threads=decode_threads,
        )
        self._tokens, self._builder, self._shared_dir, self._finalizer, self._pixels = made

        self._io = IOAccount(dataset)
        self._counters = self._io.live  # live worker generations

        self._sampler: ResumableSampler | None = None
        # the caller's sampler or batch_sampler (see loader/samplers.py)
        self._order = caller_order(sampler, batch_sampler, batch_size, drop_last)
        if self._order is None and not self._iterable:
            self._sampler = ResumableSampler(
                len(dataset), shuffle=shuffle, seed=seed, layout=self.layout, drop_last=drop_last
            )
        elif isinstance(dataset, ResumableIterable):
            # so that len(dataset) (this rank's samples per epoch) counts in the
            # loader's batches, also in the main process, which never iterates it
            dataset.configure(batch_size=batch_size, drop_last=drop_last, samples_consumed=0)
        adapter = adapt(
            dataset,
            iterable=self._iterable,
            refs=plan.batches == "refs",
            counted=bool(self._io.keys) and self._procs > 0,
            pixels=plan.pixel_batches,
        )
        self._adapter: IterableAdapter | MapStatsAdapter | None = adapter
        kwargs, unused = torch_arguments(
            plan,
            num_workers,
            torch_kwargs,
            prefetch_factor=prefetch_factor,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
        )
        if unused:
            warnings.warn(
                f"fastload.DataLoader: {' and '.join(unused)} unused: these batches are "
                f"built in the loader's own process and start no worker process "
                f"(num_workers={num_workers}); pass plan_in_workers=True to start them",
                UserWarning,
                stacklevel=2,
            )
        #: the workers' recycled batch slabs (loader/worker_slabs.py), or None
        self.worker_slabs = slab_channel(plan, adapter, prefetch_factor, recycle_batches)
        slabs = self.worker_slabs
        collate = collate_for(plan, collate_fn) if slabs is None else slabs.collate
        self._torch_loader = torch.utils.data.DataLoader(
            dataset if adapter is None else adapter,
            **batching(self._order, self._sampler, batch_size, drop_last),
            num_workers=self._procs,
            collate_fn=collate,
            pin_memory=self._torch_pins,
            timeout=timeout if self._procs else 0,
            persistent_workers=self._persistent,
            **kwargs,
        )
        self._epoch = 0
        self._batches_consumed = 0
        self._generation = 0
        self._recorder = WaitRecorder()
        self._served_here = False  # the latest iteration: stored pixels, no worker

    # ------------------------------------------- torch.utils.data.DataLoader's
    @property
    def sampler(self) -> Any:
        """The sampler given (or the given batch sampler's ``sampler``), else the
        loader's :class:`~fastload.loader.sampler.ResumableSampler` for a map-style
        dataset, torch's placeholder for an iterable one (which orders itself)."""
        if self._order is not None and self._order.sampler is not None:
            return self._order.sampler
        return self._torch_loader.sampler

    @property
    def batch_sampler(self) -> Any:
        """The ``batch_sampler`` given, else torch's ``BatchSampler`` over
        :attr:`sampler` (None for an iterable dataset, which batches in its workers)."""
        if self._order is not None:
            return self._order.batches
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
        """Samples per step over all ranks: ``batch_size x world_size`` (1 each batch_sampler)."""
        return self._batch * self.layout.world_size

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def batches_consumed(self) -> int:
        """Batches of the current epoch handed to the caller."""
        return self._batches_consumed

    def _num_batches(self) -> int | None:
        if self._order is not None:
            return self._order.epoch_length()
        if self._tokens is not None and self._tokens.streaming():
            return None  # a first pass still tokenizing: the count is not known yet
        if self._sampler is not None:
            samples = per_rank_count(self._sampler.length, self.layout.world_size, self.drop_last)
        else:
            try:
                samples = len(self.dataset)
            except TypeError:
                return None
        return count_batches(samples, self._batch, self.drop_last)

    def __len__(self) -> int:
        """Batches per epoch on this rank. Raises TypeError for an iterable dataset
        without ``__len__``, and while a ``ParquetTokenDataset(stream=True)`` streams
        its first pass (the count is known when the pass ends)."""
        n = self._num_batches()
        if n is None:
            raise TypeError(length_error(self.dataset))
        return n

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next: from batch 0 if it differs from the current
        epoch, from the resume point if it is the current one. A ``sampler`` or
        ``batch_sampler`` given gets ``set_epoch(epoch)`` too."""
        if epoch < 0:
            raise ConfigError(f"epoch must not be negative, got {epoch}")
        if self._order is not None:  # passed on to the caller's sampler
            self._order.set_epoch(epoch, restart=epoch != self._epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches_consumed = 0
            self._generation += 1  # an iterator of the old epoch must not continue

    def _advance_epoch(self) -> None:
        self._epoch += 1
        self._batches_consumed = 0
        if self._order is not None:
            self._order.end_epoch()

    # ------------------------------------------------------------- iteration
    def _prepare(self) -> WorkerCounters | None:
        self._epoch, self._batches_consumed = rolled_over(
            self._epoch, self._batches_consumed, self._num_batches()
        )
        consumed = self._batches_consumed * self.global_batch_size
        if self._order is not None:
            self._order.start(self._epoch, self._batches_consumed)
        elif self._sampler is not None:
            self._sampler.set_epoch(self._epoch)
            self._sampler.set_start(min(consumed, self._sampler.total))
        if self._order is not None or self._sampler is not None:
            # a map-style dataset whose items depend on the epoch (a crop decoder's
            # draws): its set_epoch reaches the workers (ShardedDataset: shared memory)
            forward = getattr(self.dataset, "set_epoch", None)
            if callable(forward):
                forward(self._epoch)
        else:
            # the loader's own copy follows too: its plan and len() are this epoch's
            position_dataset(
                self.dataset,
                self._epoch,
                batch_size=self._batch,
                drop_last=self.drop_last,
                samples_consumed=consumed,
            )
            assert isinstance(self._adapter, IterableAdapter)
            self._adapter.publish(self._epoch, self._batch, self.drop_last, consumed)
        self._plan_prefetch = self._make_plan_prefetcher()
        if self._io.keys and self._procs > 0 and (not self._persistent or not self._counters):
            # a new generation of worker processes gets fresh rows; old rows stay summed
            counters = self._io.generation(self._procs)
            assert self._adapter is not None
            self._adapter.counters = counters
        return self._counters[-1] if self._counters else None

    def _make_plan_prefetcher(self) -> PlanPrefetcher | None:
        if self._builder is None:
            return None
        # the batches torch keeps in flight, plus the builder's: what is being read now
        prefetch = self._torch_loader.prefetch_factor or 2
        indices, batch = None, self._batch
        if self._order is not None:
            if (planned := order_indices(self._order)) is None:
                return None  # a sampler without a length: its shards are read on demand
            indices, batch = planned
        elif self._sampler is not None:
            indices = self._sampler.rank_indices()
        return shard_prefetcher(
            self.dataset,
            indices,
            batch_size=batch,
            batches_ahead=max(1, self._procs) * prefetch + BUILD_DEPTH,
        )

    def __iter__(self) -> Iterator[Any]:
        """Yield the rest of the current epoch's batches (on ``device`` if given).

        Starting a new iterator ends any older one of this loader: its next
        ``next()`` raises RuntimeError.
        """
        self._generation += 1
        generation = self._generation
        counters = self._prepare()
        dev = self.device
        px = self._pixels  # an epoch whose every pixel is stored is built here, if it may be
        pixels = px.epoch(self._sampler, self._batch, self.drop_last) if px else None
        self._served_here = pixels is not None
        if self._tokens is not None:
            source: Iterator[Any] = self._tokens.iterate(self._batch, self.drop_last)
        elif pixels is not None:
            source = pixels
        elif dev is not None and dev.type == "cuda" and dev.index is not None:
            # torch's pin-memory thread takes the current device when the iterator is
            # made: under the loader's device, not GPU 0, on every rank
            with torch.cuda.device(self.device):
                source = iter(self._torch_loader)
        else:
            source = iter(self._torch_loader)
        if self.worker_slabs is not None and pixels is None:
            source = map(self.worker_slabs.adopt, source)
        if self._builder is not None:
            source = build_batches(
                self._builder, source, self._plan_prefetch, worker_processes=self._procs
            )
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

    @property
    def worker_processes(self) -> int:
        """Worker processes the latest iteration started (before one: per iteration; see
        ``plan_in_workers``; 0 for an epoch built from stored pixels)."""
        return 0 if self._served_here else self._procs

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
        stop_persistent_workers(getattr(self, "_torch_loader", None))
        if self._finalizer is not None:
            self._finalizer()

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
            self._recorder.record(got - asked, self._samples_in(batch))
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
            self._io.retire(counters)

    def _samples_in(self, batch: Any) -> int:
        # by what the sampler yielded, not by tensor shapes (before the count moves)
        if self._order is not None:
            return self._order.consumed()
        if self._sampler is not None:
            left = per_rank_count(self._sampler.length, self.layout.world_size, self.drop_last)
            return max(0, min(self._batch, left - self._batches_consumed * self._batch))
        return count_samples(batch, self._batch)

    # ----------------------------------------------------------------- state
    def _state_key(self) -> StateKey:
        return StateKey(
            batch_size=self._batch,
            world_size=self.layout.world_size,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            dataset_length=None if self._iterable else len(self.dataset),
        )

    def state_dict(self) -> dict[str, Any]:
        """The resume point as a small JSON-serialisable dict.

        It depends only on the epoch, the batches the caller consumed and the
        configuration, so every rank of a synchronised job returns the same dict.
        """
        epoch, consumed = rolled_over(self._epoch, self._batches_consumed, self._num_batches())
        dataset_state: dict[str, Any] = {}
        # this process's copy of the dataset, set to what the caller consumed (with
        # workers it never iterates), so its layout is the one the epoch runs on
        position_dataset(
            self.dataset,
            epoch,
            batch_size=self._batch,
            drop_last=self.drop_last,
            samples_consumed=consumed * self.global_batch_size,
        )
        if callable(getattr(self.dataset, "loader_state", None)):
            dataset_state = dict(self.dataset.loader_state())
        state = make_state(self._state_key(), epoch, consumed, dataset_state)
        if self._order is not None:
            state["sampler"] = self._order.state(consumed)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a :meth:`state_dict`: the next iteration yields the remaining
        batches of the saved epoch in the same order.

        The world size may differ if the global batch size is the same. Raises
        :class:`ConfigError` naming what differs (version, global batch size, dataset
        length, seed, shuffle, drop_last) or when the dataset cannot resume.
        """
        epoch, consumed, dataset_state = read_state(state, self._state_key(), self._num_batches())
        load_order_state(self._order, state.get("sampler"), consumed)
        restore_dataset(self.dataset, dataset_state, iterable=self._iterable, consumed=consumed)
        self._epoch = epoch
        self._batches_consumed = consumed
        self._generation += 1

    # ----------------------------------------------------------------- stats
    def io_stats(self) -> dict[str, float]:
        """The dataset's I/O counters summed over the main process and every worker."""
        return self._io.totals()

    def stats(self) -> LoaderStats:
        """Waits, throughput and the dataset's I/O counters since the loader was made."""
        return LoaderStats.build(self._recorder, self.io_stats())

    def pool_stats(self) -> PoolStats | None:
        """Counters of the host staging pool, or None before device feeding started."""
        return None if self._prefetcher is None else self._prefetcher.pool.stats()
