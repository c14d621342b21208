"""The batch transport: workers say where a batch's bytes are; the loader's process
builds the batch from its own mapping of the same node-local cache entries.

Who owns which bytes, when:

1. A DataLoader worker (or the loader's process itself with ``num_workers=0``)
   plans its samples, makes sure each sample's shard is in a node-local tier (the
   NVMe ``cache_dir``, or the loader's RAM-backed shared tier, see
   :mod:`fastload.loader.dataloader`), keeps it pinned in its LRU of open shards, and
   yields a :class:`~fastload.datasets.source.SampleRef` per sample. torch's
   collate step in the worker is :func:`collate_refs`: the batch that crosses the
   process boundary is a :class:`RefBatch` of a few numpy arrays (~40 bytes per
   field per sample), never the sample bytes.
2. The loader's process maps the same cache entries (:class:`ShardSource` opens and
   pins them in its own LRU) and :class:`BatchBuilder` copies each field's bytes,
   once, into one contiguous buffer per field (:class:`~fastload.packed.PackedBytes`),
   allocated pinned when the loader feeds a CUDA device. The batch owns that
   buffer: it stays valid for as long as the caller keeps it, whatever happens to the
   cache afterwards. An entry evicted between the worker's look and the copy is
   fetched again under the same content address (the bytes are the same).
3. With a built-in :class:`~fastload.decode.Decoder`, the same process decodes the
   samples in a thread pool (Pillow and Pillow-SIMD release the GIL while they
   decode and resize) and writes images of one size into one preallocated
   channels-last batch tensor (:func:`stack_images`).

Nothing here depends on torch's worker machinery: :meth:`BatchBuilder.build` turns
one RefBatch into a batch, :meth:`BatchBuilder.iterate` keeps ``depth`` of them in
flight on the pool, in order.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from fastload.datasets.source import SampleRef, ShardSource
from fastload.decode import Decoder
from fastload.errors import CacheError, ConfigError
from fastload.loader.decoded import decode_batch, fixed_image_shape
from fastload.loader.slabs import SlabPool, shared_pool
from fastload.packed import PackedBytes

__all__ = [
    "BatchBuilder",
    "PlanPrefetcher",
    "RefBatch",
    "TransportStats",
    "collate_decoded",
    "collate_refs",
    "shared_batch",
    "stack_images",
]


@dataclass
class RefBatch:
    """Where the bytes of a batch are: sample ``i``'s field ``fields[f]`` lies at
    ``spans[i, f] = (offset, size)`` of shard ``shards[i]`` (size -1: the sample has no
    such field). Crosses from workers to the loader's process instead of the bytes."""

    keys: list[str]
    shards: np.ndarray
    fields: tuple[str, ...]
    spans: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Payload bytes the batch refers to."""
        sizes = self.spans[:, :, 1]
        return int(sizes[sizes > 0].sum())


def collate_refs(refs: Sequence[SampleRef]) -> RefBatch:
    """Collate the :class:`SampleRef` records of one batch (runs in the worker).
    Fields are listed in order of first appearance."""
    fields: dict[str, int] = {}
    for ref in refs:
        if not isinstance(ref, SampleRef):
            raise TypeError(
                f"the batch transport expected SampleRef records, got {type(ref).__name__}"
            )
        for name, _, _ in ref.spans:
            if name not in fields:
                fields[name] = len(fields)
    spans = np.full((len(refs), len(fields), 2), -1, dtype=np.int64)
    shards = np.empty(len(refs), dtype=np.int64)
    keys: list[str] = []
    for i, ref in enumerate(refs):
        keys.append(ref.key)
        shards[i] = ref.shard
        for name, offset, size in ref.spans:
            spans[i, fields[name]] = (offset, size)
    return RefBatch(keys, shards, tuple(fields), spans)


@dataclass
class TransportStats:
    """Counters of a :class:`BatchBuilder`: batches and samples built, payload bytes
    copied out of the cache's mappings, samples decoded in the thread pool."""

    batches: int = 0
    samples: int = 0
    bytes_copied: int = 0
    decoded: int = 0


Alloc = Callable[[tuple[int, ...]], torch.Tensor]


def _empty(shape: tuple[int, ...], pin: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=pin)


def shared_batch(shape: tuple[int, ...]) -> torch.Tensor:
    """A uint8 tensor of ``shape`` in fresh shared memory (a worker's batch)."""
    return _shared(shape)


def _shared(shape: tuple[int, ...]) -> torch.Tensor:
    # a worker's batch goes to the loader's process through shared memory: allocate it
    # there (what torch's default_collate does), not on the heap to be copied over:
    # a new shared storage directly (share_memory_() of an empty tensor also faults in
    # and copies a heap buffer: 18 ms of CPU per 64 images of 224x224x3, against 11)
    n = 1
    for d in shape:
        n *= int(d)
    storage = torch.UntypedStorage._new_shared(n)
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def stack_images(
    images: Sequence[torch.Tensor], pin: bool = False, alloc: Alloc | None = None
) -> torch.Tensor:
    """Stack uint8 images into one batch tensor.

    Images are CHW tensors (possibly permuted views of HWC arrays, as
    :func:`fastload.decode.to_tensor` gives) or HWC: the result is ``(N, C, H, W)``
    in channels-last memory (``(N, H, W, C)`` for HWC inputs), written by one
    contiguous copy per image into a buffer allocated once (pinned with ``pin``, or
    by ``alloc(shape)`` for uint8 images, e.g. :meth:`SlabPool.array`).
    Raises :class:`ConfigError` naming the shapes when they differ: give the dataset
    ``size=(h, w)`` (or ``decode=..., size=...`` with an exact size) to batch them.
    """
    first = images[0]
    shape = tuple(first.shape)
    for k, img in enumerate(images):
        if tuple(img.shape) != shape:
            raise ConfigError(
                f"images of different sizes cannot be stacked into one batch: item 0 is "
                f"{shape}, item {k} is {tuple(img.shape)}; give the dataset an exact "
                "size (size=(height, width)) or pass your own collate_fn"
            )
    chw = first.ndim == 3 and first.stride(0) == 1 and first.shape[0] in (1, 3, 4)
    n = len(images)

    def empty(dims: tuple[int, ...]) -> torch.Tensor:
        if alloc is not None and first.dtype == torch.uint8 and not pin:
            return alloc(dims)
        return torch.empty(dims, dtype=first.dtype, pin_memory=pin)

    # numpy copies: torch's copy_ from several decode threads at once ran its own
    # intra-op threads and cost 1.4-2.2x the CPU of decoding in worker processes
    if chw:
        c, h, w = shape
        out = empty((n, h, w, c))
        dst = out.numpy() if out.device.type == "cpu" else None
        for k, img in enumerate(images):
            hwc = img.permute(1, 2, 0)
            if dst is not None and hwc.device.type == "cpu":
                dst[k] = hwc.numpy()
            else:
                out[k].copy_(hwc)
        return out.permute(0, 3, 1, 2)
    out = empty((n, *shape))
    dst = out.numpy() if out.device.type == "cpu" else None
    for k, img in enumerate(images):
        if dst is not None and img.device.type == "cpu":
            dst[k] = img.numpy()
        else:
            out[k].copy_(img)
    return out


def _collate_decoded(
    samples: Sequence[Mapping[str, Any]], pin: bool, alloc: Alloc | None = None
) -> dict[str, Any]:
    """The default collate of decoded samples: images stacked channels-last, numbers
    as tensors, strings/dicts/other objects as lists, raw bytes packed."""
    from torch.utils.data import default_collate

    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for s in samples for k in s))
    # images decoded straight into their batch tensor (loader/decoded.py): as they are
    decoded: Mapping[str, torch.Tensor] = getattr(samples, "batches", {})
    for name in keys:
        values = [s.get(name) for s in samples]
        head = values[0]
        if name in decoded and _slots_of(values, decoded[name], pin):
            batch = decoded[name]  # (N, H, W, C); CHW images: (N, C, H, W) channels-last
            hwc = tuple(cast("torch.Tensor", head).stride()) == tuple(batch.stride()[1:])
            out[name] = batch if hwc else batch.permute(0, 3, 1, 2)
        elif (
            name == "__key__"
            or isinstance(head, (str, dict, list))
            or any(v is None for v in values)
        ):
            out[name] = values  # also where some samples lack the field
        elif isinstance(head, torch.Tensor) and head.dtype == torch.uint8 and head.ndim >= 2:
            out[name] = stack_images(cast("list[torch.Tensor]", values), pin=pin, alloc=alloc)
        elif isinstance(head, np.ndarray) and head.dtype == np.uint8 and head.ndim >= 2:
            images = [torch.from_numpy(v) for v in values]
            out[name] = stack_images(images, pin=pin, alloc=alloc)
        elif isinstance(head, (bytes, bytearray, memoryview)):
            out[name] = PackedBytes.from_list(values)
        elif isinstance(head, (int, float, bool, np.generic, torch.Tensor, np.ndarray, Mapping)):
            out[name] = default_collate(values)
        else:
            out[name] = values  # PIL images and other objects: one per sample
    return out


def _slots_of(values: Sequence[Any], batch: torch.Tensor, pin: bool) -> bool:
    # each value is still the view of its own slot of ``batch`` (HWC, or CHW permuted)
    if len(values) != batch.shape[0] or (pin and not batch.is_pinned()):
        return False
    base = batch.data_ptr()
    step = batch.stride(0)
    for k, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.data_ptr() != base + k * step:
            return False
        if v.numel() != batch[k].numel():
            return False
    return True


def gather_numpy(dst: object, sources: Sequence[object], pieces: object) -> int:
    """:func:`fastload._native.gather` in numpy, for a tree without the built extension
    (the device machine's copy of the working tree): rows ``(source, source offset,
    size, dst offset)`` of an int64 array, all checked before any is copied; -1, or
    the first row out of bounds (nothing copied then). Holds the GIL between rows."""
    out = np.frombuffer(cast("Any", dst), dtype=np.uint8)
    if not out.flags.writeable:
        raise TypeError("gather: the destination buffer is read-only")
    views = [np.frombuffer(cast("Any", src), dtype=np.uint8) for src in sources]
    rows = np.asarray(pieces, dtype=np.int64).reshape(-1, 4).tolist()
    for i, (s, o, n, d) in enumerate(rows):
        if not 0 <= s < len(views) or min(o, n, d) < 0:
            return i
        if o + n > views[s].size or d + n > out.size:
            return i
    for s, o, n, d in rows:
        if n:
            out[d : d + n] = views[s][o : o + n]
    return -1


try:  # one native call per field, without the GIL (see BatchBuilder._pack)
    from fastload._native import gather as _gather
except ImportError:  # pragma: no cover - only where the extension is not built
    _gather = gather_numpy


class _ShardBytes:
    """Reads byte ranges of one open cached shard out of its mapping (or the RAM
    tier's bytes). Copying from the mapping measured 1.1-4x faster than ``pread`` into
    the same buffers here (no syscall per sample once the pages are mapped). The mapped
    pages count in this process's RSS, but they are the page cache's (shared,
    reclaimable, charged to the cgroup either way)."""

    __slots__ = ("_view", "name")

    def __init__(self, cached: Any, name: str) -> None:
        self._view: np.ndarray | None = np.frombuffer(cached.data, dtype=np.uint8)
        self.name = name

    @property
    def buffer(self) -> np.ndarray:
        """The whole shard's bytes (a source of the batch's gather)."""
        assert self._view is not None
        return self._view

    def past_end(self, offset: int, size: int) -> CacheError:
        """The error for a byte range that runs past the end of this shard."""
        assert self._view is not None
        return CacheError(
            f"a sample of {size} bytes at offset {offset} runs past the end of cached "
            f"shard {self.name!r} "
            f"({self._view.size} bytes); run `fastload cache verify`"
        )

    def read(self, offset: int, size: int) -> bytes:
        assert self._view is not None
        if offset < 0 or offset + size > self._view.size:
            raise self.past_end(offset, size)
        return self._view[offset : offset + size].tobytes()

    def close(self) -> None:
        self._view = None


def collate_decoded(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The default collate of decoded samples, also in DataLoader workers: images of
    one size stacked channels-last (in shared memory inside a worker), numbers as
    tensors, strings, dicts and other objects as lists, bytes packed."""
    from torch.utils.data import get_worker_info

    return _collate_decoded(samples, False, _shared if get_worker_info() is not None else None)


class BatchBuilder:
    """Builds batches from :class:`RefBatch` records in the loader's process.

    ``source`` is the loader's own :class:`ShardSource` of the dataset; ``decoder`` a
    sample decoder (None: raw batches); ``collate_fn`` the user's collate (None: the
    packed default for raw batches, :func:`_collate_decoded` for decoded ones); it is
    called on the list of samples as the dataset would have returned them (raw
    samples as ``{"__key__": str, field: bytes}``). ``threads`` decode (and copy) in
    parallel; ``pin`` allocates batch buffers in pinned memory; ``batch_decoder``
    (with no ``decoder``/``collate_fn``) takes each packed batch whole, e.g.
    :class:`fastload.decode.gpu.NvjpegDecoder`.
    """

    def __init__(
        self,
        source: ShardSource,
        decoder: Callable[[dict[str, Any]], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        threads: int = 1,
        pin: bool = False,
        batch_decoder: Callable[[dict[str, Any]], Any] | None = None,
        device: Any = None,
    ) -> None:
        if threads < 1:
            raise ConfigError(f"decode threads must be >= 1, got {threads}")
        self.source = source
        self.decoder = decoder
        self.collate_fn = collate_fn
        self.threads = threads
        self.pin = pin
        self.batch_decoder = batch_decoder  # whole packed batches (nvJPEG on the GPU)
        self.device = device  # the CUDA device its threads pin for and decode on
        self.stats = TransportStats()
        # batch buffers: pinned ones come from torch's caching host allocator; plain
        # ones from the process's pool of slabs, recycled when the caller drops a batch
        self.slabs: SlabPool = shared_pool()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- pieces
    def _views(self, rb: RefBatch) -> dict[int, _ShardBytes]:
        views: dict[int, _ShardBytes] = {}
        shards = self.source.manifest.shards
        for s in np.unique(rb.shards).tolist():
            views[int(s)] = _ShardBytes(self.source.shard(int(s)), shards[int(s)].name)
        return views

    def _pack(self, rb: RefBatch, views: Mapping[int, _ShardBytes]) -> dict[str, Any]:
        # one native gather per field, with the GIL released for the whole copy. A
        # Python loop of per-sample numpy copies dropped and re-took the GIL for every
        # sample and waited for whichever thread held it each time: with a thread
        # running Python beside it, 16-19 ms a batch of 64 x 156 KB instead of ~1 ms;
        # in a cold epoch planning and copying took turns instead of overlapping
        out: dict[str, Any] = {"__key__": list(rb.keys)}
        order = sorted(views)
        sources = [views[s].buffer for s in order]
        which = np.searchsorted(np.asarray(order, dtype=np.int64), rb.shards)
        pieces = np.empty((len(rb), 4), dtype=np.int64)
        pieces[:, 0] = which
        total = 0
        for f, name in enumerate(rb.fields):
            sizes = rb.spans[:, f, 1]
            missing = np.flatnonzero(sizes < 0).tolist()
            clipped = np.maximum(sizes, 0)
            offsets = np.zeros(len(rb) + 1, dtype=np.int64)
            np.cumsum(clipped, out=offsets[1:])
            nbytes = int(offsets[-1])
            data = _empty((nbytes,), pin=True) if self.pin else self.slabs.tensor(nbytes)
            pieces[:, 1] = np.where(sizes < 0, 0, rb.spans[:, f, 0])
            pieces[:, 2] = clipped
            pieces[:, 3] = offsets[:-1]
            bad = _gather(data.numpy(), sources, pieces)
            if bad >= 0:
                shard = views[int(rb.shards[bad])]
                raise shard.past_end(int(pieces[bad, 1]), int(pieces[bad, 2]))
            total += nbytes
            out[name] = PackedBytes(data, torch.from_numpy(offsets), missing)
        self._count(rb, total)
        return out

    def _samples(self, rb: RefBatch, views: Mapping[int, _ShardBytes]) -> list[dict[str, Any]]:
        samples: list[dict[str, Any]] = []
        total = 0
        for i, key in enumerate(rb.keys):
            view = views[int(rb.shards[i])]
            sample: dict[str, Any] = {"__key__": key}
            for f, name in enumerate(rb.fields):
                offset, size = rb.spans[i, f].tolist()
                if size >= 0:
                    sample[name] = view.read(offset, size)
                    total += size
            samples.append(sample)
        self._count(rb, total)
        return samples

    def _count(self, rb: RefBatch, nbytes: int) -> None:
        with self._lock:
            self.stats.batches += 1
            self.stats.samples += len(rb)
            self.stats.bytes_copied += nbytes
        tier = "disk" if self.source.cache_dir is not None else "ram"
        self.source.count_served(tier, nbytes)

    def _decode_all(self, samples: list[dict[str, Any]]) -> list[Any]:
        decoder = self.decoder
        assert decoder is not None
        if self.threads == 1 or len(samples) == 1:
            out = [decoder(s) for s in samples]
        else:
            out = list(self._executor().map(decoder, samples))
        with self._lock:
            self.stats.decoded += len(out)
        return out

    def _decode_into(self, samples: list[dict[str, Any]]) -> list[Any]:
        decoder = self.decoder
        assert isinstance(decoder, Decoder)
        alloc = functools.partial(_empty, pin=True) if self.pin else self.slabs.array
        threaded = self.threads > 1 and len(samples) > 1
        out = decode_batch(samples, decoder, alloc, self._executor().map if threaded else map)
        with self._lock:
            self.stats.decoded += len(out)
        return out

    def _thread_device(self) -> None:
        # pinned allocations and nvJPEG calls of this thread go to the loader's GPU
        dev = self.device
        if dev is not None and getattr(dev, "type", None) == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():
            self._pool, self._pid = None, os.getpid()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.threads, thread_name_prefix="fastload-build", initializer=self._thread_device
            )
        return self._pool

    # ----------------------------------------------------------------- build
    def build(self, rb: RefBatch, views: dict[int, _ShardBytes] | None = None) -> Any:
        """The batch ``rb`` refers to (synchronously, in the calling thread); ``views``:
        its shards' bytes, taken when it was planned (else taken here)."""
        if not isinstance(rb, RefBatch):
            raise TypeError(f"expected a RefBatch from the workers, got {type(rb).__name__}")
        if views is None:
            views = self._views(rb)
        try:
            if self.decoder is None and self.collate_fn is None:
                batch = self._pack(rb, views)
            else:
                samples: list[Any] = self._samples(rb, views)
        finally:
            for v in views.values():
                v.close()
        if self.decoder is None and self.collate_fn is None:
            if self.batch_decoder is not None:
                batch = self.batch_decoder(batch)
                with self._lock:
                    self.stats.decoded += len(rb)
            return batch
        if self.decoder is not None:
            if self.collate_fn is None and fixed_image_shape(self.decoder) is not None:
                # images decoded straight into the batch's (pinned or recycled) memory
                return _collate_decoded(self._decode_into(samples), self.pin)
            samples = self._decode_all(samples)
            if self.collate_fn is None:
                return _collate_decoded(samples, self.pin, self.slabs.array)
        assert self.collate_fn is not None
        return self.collate_fn(samples)

    def iterate(
        self, refs: Iterator[RefBatch], depth: int = 2, pull_in_thread: bool = False
    ) -> Iterator[Any]:
        """Build the batches of ``refs`` in order, ``depth`` of them in flight on a
        background thread (decoding fans out further over the pool), so building batch
        k+1 overlaps the caller's work on batch k. ``pull_in_thread``: a second thread
        draws the RefBatches from ``refs`` (when ``refs`` plans in this process), one
        batch ahead of the builder, so planning batch k+1 (Python, holding the GIL)
        overlaps copying batch k (native, without it) and leaves the caller's thread."""
        depth = max(1, depth)
        # one builder thread keeps batches in order; decode work inside it fans out
        # over the decode pool
        builder = ThreadPoolExecutor(
            1, thread_name_prefix="fastload-batch", initializer=self._thread_device
        )
        planner = (
            ThreadPoolExecutor(1, thread_name_prefix="fastload-plan") if pull_in_thread else None
        )
        done = object()

        def pull() -> Any:
            rb: Any = next(refs, done)  # one planner thread, tasks in order: so the pulls
            # the views are taken where the batch was planned, while its shards are
            # still open in the source's LRU: planning the next batch may close them
            # there (their pins go, so a tight cache cap still has room for the next
            # shards; the mapping stays readable while these views hold it). Taken in
            # the builder instead, a closed shard was re-opened, and under a cap of a
            # few shards waited for room that the planner's pins held (room_wait_s, then
            # an uncached read or CacheFullError)
            if isinstance(rb, RefBatch):
                return rb, self._views(rb)
            return rb if rb is done else (rb, None)  # build() names what it got

        def build_planned(planned: Future[Any]) -> Any:
            got = planned.result()
            return done if got is done else self.build(*got)

        pending: deque[Future[Any]] = deque()
        join = True  # the threads are joined, except after a Ctrl-C (see below)
        try:
            exhausted = False
            while True:
                while not exhausted and len(pending) < depth:
                    if planner is not None:
                        pending.append(builder.submit(build_planned, planner.submit(pull)))
                        continue
                    item: Any = next(refs, done)
                    if item is done:
                        exhausted = True
                        break
                    pending.append(builder.submit(self.build, item))
                if not pending:
                    return
                batch = _result(pending.popleft())
                if batch is done:
                    exhausted = True
                    continue
                yield batch
        except KeyboardInterrupt:
            # the caller's Ctrl-C goes up now: a build blocked in a wait of its own
            # (room, another process's download) ends by its deadline, not the caller's
            join = False
            raise
        finally:
            for fut in pending:
                fut.cancel()
            if not sys.is_finalizing():  # a generator collected at exit: threads are gone
                if planner is not None:
                    planner.shutdown(wait=join, cancel_futures=True)
                builder.shutdown(wait=join, cancel_futures=True)
                self.close(join)  # idle decode threads do not outlive the epoch

    def close(self, join: bool = True) -> None:
        """Stop the decode threads (``join=False``: without waiting for the loads they
        are in, which end by their own deadlines)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=join, cancel_futures=True)
        self._pool = None


class PlanPrefetcher:
    """Stages shards ahead of the batches from the loader's process, in the order the
    epoch's plan first uses them: one schedule per rank (so per node, through the
    tier's single flight).

    ``first_batch[k]`` is the batch (of this rank's remaining epoch) that first reads
    ``order[k]``. When batch ``b`` has been built, every shard first read by batches up
    to ``b + batches_ahead`` is scheduled, plus ``ahead`` shards after those: a shuffled
    first batch that reads every shard gets every shard fetched at once, not one at a
    time by the worker that reaches it. The shards' index sidecars are loaded on a
    few threads of their own as they are scheduled (a worker would fetch each one just
    before its shard)."""

    def __init__(
        self,
        source: ShardSource,
        order: Sequence[int],
        ahead: int,
        first_batch: Sequence[int] | None = None,
        batches_ahead: int = 0,
        index_threads: int = 4,
    ) -> None:
        self.source = source
        self.order = [int(s) for s in order]
        self.first_batch = (
            [0] * len(self.order) if first_batch is None else [int(b) for b in first_batch]
        )
        self.ahead = max(0, ahead)
        self.batches_ahead = max(0, batches_ahead)
        self._scheduled_to = 0  # order[:_scheduled_to] has been scheduled
        self._built = -1
        self._index_threads = index_threads
        self._index_pool: ThreadPoolExecutor | None = None
        self._indexed = 0
        self._closed = False  # no index thread starts after close()
        self.scheduled = 0

    def start(self) -> None:
        """Schedule what the first batches need."""
        self._schedule()

    def advance(self) -> None:
        """Note that one more batch was handed on; schedule what the next batches need."""
        self._built += 1
        self._schedule()

    def _schedule(self) -> None:
        horizon = self._built + 1 + self.batches_ahead
        end = bisect.bisect_right(self.first_batch, horizon)
        end = min(len(self.order), end + self.ahead)
        if end <= self._scheduled_to:
            return
        # the shards being read now stay in the schedule: one the workers still wait
        # for must not lose its place to a later one
        first = bisect.bisect_left(self.first_batch, self._built + 1)
        self._scheduled_to = end
        self.source.prefetch(self.order[min(first, end - 1) : end])
        self.scheduled += 1
        self._load_indexes(end)

    def _load_indexes(self, end: int) -> None:
        if self._index_threads < 1 or self._indexed >= end or self._closed:
            return
        if self._index_pool is None:
            self._index_pool = ThreadPoolExecutor(
                self._index_threads, thread_name_prefix="fastload-index"
            )
        for s in self.order[self._indexed : end]:
            self._index_pool.submit(self._index_quietly, s)
        self._indexed = end

    def _index_quietly(self, shard: int) -> None:
        # errors resurface where the shard is read, with its sample's context
        with contextlib.suppress(Exception):
            self.source.index(shard)

    def close(self, wait: bool = True) -> None:
        """Stop the index threads (pending loads are dropped) and start no more.
        ``wait=False`` does not join them (they end after the load they are in): for
        finalizers, which may run on any thread, one of these or one holding a lock
        they wait for; a later ``close()`` joins them."""
        self._closed = True
        pool = self._index_pool
        if pool is None or sys.is_finalizing():
            return
        if threading.current_thread().name.startswith("fastload-index"):
            wait = False  # a collection that ran on one of them: it cannot join itself
        pool.shutdown(wait=wait, cancel_futures=True)
        if wait:
            self._index_pool = None


def _result(fut: Future[Any]) -> Any:
    """``fut.result()``, waiting in short slices: a Ctrl-C that the kernel delivers to
    another thread of the process (any thread may take a process-directed signal) only
    sets Python's flag, and the main thread sees it when it next runs bytecode. An
    untimed wait for a batch whose builder is blocked (waiting for room, or for another
    process's download) would hold it off until the batch came (benchmarks/soak.py: a
    pod not out 30 s after Ctrl-C)."""
    while not fut.done():
        wait([fut], timeout=0.2)
    return fut.result()
