"""Moving batches to the device one batch ahead, on a side stream, from pinned memory.

:class:`DevicePrefetcher` holds the algorithm; the stream specifics live in a
:class:`CopyStream`: :class:`CudaCopyStream` (a side CUDA stream, events,
``wait_stream``/``record_stream``) or :class:`SyncCopyStream` (the no-op
implementation for CPU and other devices: copies complete when issued). Both run
through the same prefetcher and the same :class:`HostBufferPool`, so the CPU tests
exercise every line except the CUDA calls. ``docs/loader-sync.md`` explains why
the synchronisation is correct.

A :class:`~fastload.packed.PackedBytes` (the raw fields of a batch) is one leaf:
its ``data`` buffer is staged and copied whole (one copy per field), into a pooled
buffer of a rounded-up size so that batches of slightly different byte counts
reuse the same pinned buffers.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fastload.packed import PackedBytes

__all__ = [
    "CopyStream",
    "CudaCopyStream",
    "DevicePrefetcher",
    "HostBufferPool",
    "PoolStats",
    "SyncCopyStream",
    "byte_bucket",
    "first_tensor",
    "map_tensors",
    "tensor_leaves",
]


TensorFn = Callable[[torch.Tensor], torch.Tensor]


def map_tensors(obj: Any, fn: TensorFn, packed_fn: TensorFn | None = None) -> Any:
    """Apply ``fn`` to every tensor in a nested batch (dicts, lists, tuples, namedtuples),
    keeping the structure and leaving everything else as it is.

    A :class:`~fastload.packed.PackedBytes` is a leaf: its ``data`` tensor goes through
    ``packed_fn`` (default ``fn``) via ``map_data``, so it is moved in one piece."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, PackedBytes):
        return obj.map_data(fn if packed_fn is None else packed_fn)
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn, packed_fn) for k, v in obj.items()}
        try:
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:  # mappings whose constructor takes other arguments
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn, packed_fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn, packed_fn) for v in obj)
    return obj


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested batch, in traversal order (a PackedBytes gives its
    ``data``)."""
    leaves: list[torch.Tensor] = []

    def visit(t: torch.Tensor) -> torch.Tensor:
        leaves.append(t)
        return t

    map_tensors(obj, visit)
    return leaves


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor of a nested batch in traversal order, or None (stops early).
    PackedBytes are skipped: their ``data`` is not indexed by sample."""
    if isinstance(obj, torch.Tensor):
        return obj
    values: Any
    if isinstance(obj, Mapping):
        values = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    else:
        return None
    for v in values:
        if isinstance(v, (str, bytes, int, float)):
            continue
        found = first_tensor(v)
        if found is not None:
            return found
    return None


class CopyEvent(Protocol):
    """Marks the point in a stream after a batch's copies were issued."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _DoneEvent:
    """The event of a synchronous copy: complete as soon as it exists."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


@dataclass(frozen=True)
class PoolStats:
    """Counters of a :class:`HostBufferPool`.

    ``allocations`` new buffers, ``reuses`` buffers handed out again, ``evictions``
    free buffers dropped to make room for another shape, ``waits`` times the pool
    blocked on an in-flight copy to free a buffer, ``overflows`` buffers allocated
    past the cap because one batch alone needs more, ``free``/``in_flight`` now.
    """

    allocations: int
    reuses: int
    evictions: int
    waits: int
    overflows: int
    free: int
    in_flight: int
    pinned: bool


_MIN_BUCKET = 1 << 16


def byte_bucket(nbytes: int) -> int:
    """``nbytes`` rounded up to the next of ``2**k * (1, 1.25, 1.5, 1.75)``, at least
    64 KiB (the sizes :meth:`HostBufferPool.acquire_bytes` allocates)."""
    if nbytes <= _MIN_BUCKET:
        return _MIN_BUCKET
    octave = 1 << (int(nbytes - 1).bit_length() - 1)  # largest power of two < nbytes
    step = octave // 4
    return octave + -(-(nbytes - octave) // step) * step


class HostBufferPool:
    """Reusable host staging buffers keyed by (shape, dtype), at most ``max_buffers``.

    A buffer handed out by :meth:`acquire` comes back through :meth:`release_after`
    with the event of the copy reading it; it is reused only once that event has
    completed, so a pending device copy never reads a buffer being refilled. When
    the pool is full, free buffers of other shapes are evicted (least recently
    used first); if every buffer is in flight, the pool waits for the oldest copy.
    """

    def __init__(self, max_buffers: int = 16, *, pin: bool = True) -> None:
        if max_buffers < 1:
            raise ValueError(f"max_buffers must be at least 1, got {max_buffers}")
        self.max_buffers = max_buffers
        self.pin = pin
        self._free: OrderedDict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = (
            OrderedDict()
        )
        self._in_flight: deque[tuple[CopyEvent, list[torch.Tensor]]] = deque()
        self._held = 0  # handed out, not yet released
        self._allocations = self._reuses = self._evictions = self._waits = self._overflows = 0

    def _count_free(self) -> int:
        return sum(len(v) for v in self._free.values())

    def _count_in_flight(self) -> int:
        return sum(len(bufs) for _, bufs in self._in_flight)

    def _reclaim(self) -> None:
        while self._in_flight and self._in_flight[0][0].query():
            _, bufs = self._in_flight.popleft()
            for b in bufs:
                key = (tuple(b.shape), b.dtype)
                self._free.setdefault(key, []).append(b)

    def _evict_one(self) -> bool:
        for key, bufs in self._free.items():  # oldest key first
            if bufs:
                bufs.pop()
                if not bufs:
                    del self._free[key]
                self._evictions += 1
                return True
        return False

    def acquire(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Return a host buffer of ``shape`` and ``dtype`` (pinned if the pool pins)."""
        key = (tuple(shape), dtype)
        self._reclaim()
        while True:
            bufs = self._free.get(key)
            if bufs:
                self._free.move_to_end(key)
                self._reuses += 1
                self._held += 1
                return bufs.pop()
            total = self._count_free() + self._count_in_flight() + self._held
            if total < self.max_buffers or self._evict_one():
                self._allocations += 1
                break
            if self._in_flight:
                self._waits += 1
                self._in_flight[0][0].synchronize()
                self._reclaim()
                continue
            self._overflows += 1  # this batch alone holds every buffer
            self._allocations += 1
            break
        self._held += 1
        return torch.empty(key[0], dtype=dtype, pin_memory=self.pin)

    def acquire_bytes(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 host buffer of at least ``nbytes`` (a PackedBytes' data): the
        size is rounded up to a quarter-octave step (at most 25% over, at least 64 KiB),
        so byte counts that vary a little between batches share buffers."""
        return self.acquire((byte_bucket(nbytes),), torch.uint8)

    def release_after(self, buffers: list[torch.Tensor], event: CopyEvent) -> None:
        """Give ``buffers`` back, reusable once ``event`` has completed."""
        self._held -= len(buffers)
        if buffers:
            self._in_flight.append((event, buffers))
        self._reclaim()
        while self._count_free() + self._count_in_flight() > self.max_buffers:
            if not self._evict_one():
                break

    def stats(self) -> PoolStats:
        """The pool's counters now."""
        self._reclaim()
        return PoolStats(
            allocations=self._allocations,
            reuses=self._reuses,
            evictions=self._evictions,
            waits=self._waits,
            overflows=self._overflows,
            free=self._count_free(),
            in_flight=self._count_in_flight(),
            pinned=self.pin,
        )


class CopyStream(Protocol):
    """Where and how host tensors are copied to the device."""

    device: torch.device
    can_pin: bool

    def active(self) -> contextlib.AbstractContextManager[Any]:
        """Context in which copies are issued (the side stream)."""
        ...

    def copy(self, host: torch.Tensor) -> torch.Tensor:
        """Issue the copy of ``host`` to the device; returns the device tensor."""
        ...

    def record_event(self) -> CopyEvent:
        """An event after every copy issued so far."""
        ...

    def hand_over(self, tensors: list[torch.Tensor]) -> None:
        """Make ``tensors`` safe to use, and to free, on the caller's current stream."""
        ...


class SyncCopyStream:
    """The no-op stream: copies are synchronous ``tensor.to(device)`` calls (CPU and any
    device without streams); events are complete at once and hand-over does nothing."""

    can_pin = False

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def copy(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, copy=True)

    def record_event(self) -> CopyEvent:
        return _DoneEvent()

    def hand_over(self, tensors: list[torch.Tensor]) -> None:
        return None


class CudaCopyStream:
    """Copies on a side CUDA stream of ``device`` (see ``docs/loader-sync.md``)."""

    can_pin = True

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(device=self.device)

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream)

    def copy(self, host: torch.Tensor) -> torch.Tensor:
        # asynchronous only from pinned memory; pageable sources copy synchronously
        return host.to(self.device, non_blocking=True)

    def record_event(self) -> CopyEvent:
        # blocking: the pool's synchronize() sleeps on the event instead of spinning
        event = torch.cuda.Event(blocking=True)
        event.record(self.stream)
        return event

    def hand_over(self, tensors: list[torch.Tensor]) -> None:
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for t in tensors:
            if t.device.type == "cuda":
                t.record_stream(current)


def make_copy_stream(device: torch.device | str) -> CopyStream:
    """:class:`CudaCopyStream` for a CUDA device, :class:`SyncCopyStream` otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaCopyStream(dev)
    return SyncCopyStream(dev)


@dataclass
class _InFlight:
    batch: Any
    leaves: list[torch.Tensor]
    sources: list[torch.Tensor]  # keeps host tensors alive until the hand-over


class DevicePrefetcher:
    """Copies batches to ``stream.device`` one batch ahead of the caller.

    ``stage``: copy tensors that are not already pinned into a pooled host buffer
    first (pinned where the stream can pin), so the device copy is asynchronous;
    without it tensors are copied from where they are. Tensors already on the
    target accelerator and non-tensor leaves are passed through. With a CPU target
    host tensors still take the whole path (stage, copy), which is what makes the
    CPU no-op stream a faithful test of the CUDA path; it costs a copy, so use
    ``device=None`` for plain CPU training.
    """

    def __init__(self, stream: CopyStream, *, stage: bool = True, max_buffers: int = 16) -> None:
        self.stream = stream
        self.stage = stage
        self.pool = HostBufferPool(max_buffers, pin=stream.can_pin)

    def start(self, batch: Any) -> _InFlight:
        """Issue the copies of ``batch`` (on the side stream); returns the pending batch."""
        staged: list[torch.Tensor] = []
        leaves: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        device = self.stream.device

        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device == device and device.type != "cpu":
                return t  # already there (a dataset that yields device tensors)
            src = t
            if self.stage and t.device.type == "cpu" and not (self.pool.pin and t.is_pinned()):
                src = self.pool.acquire(t.shape, t.dtype)
                src.copy_(t)
                staged.append(src)
            else:
                sources.append(t)
            out = self.stream.copy(src)
            leaves.append(out)
            return out

        def move_packed(data: torch.Tensor) -> torch.Tensor:
            # a PackedBytes' buffer: its byte count changes from batch to batch, so it
            # is staged into a rounded-up pooled buffer and copied from a view of it
            if data.device == device and device.type != "cpu":
                return data
            if (
                self.stage
                and data.device.type == "cpu"
                and not (self.pool.pin and data.is_pinned())
            ):
                buf = self.pool.acquire_bytes(data.numel())
                view = buf[: data.numel()]
                view.copy_(data)
                staged.append(buf)
                out = self.stream.copy(view)
                leaves.append(out)
                return out
            return move(data)

        with self.stream.active():
            moved = map_tensors(batch, move, move_packed)
            event = self.stream.record_event()
        self.pool.release_after(staged, event)
        return _InFlight(moved, leaves, sources)

    def finish(self, pending: _InFlight) -> Any:
        """Make a pending batch usable on the caller's current stream and return it."""
        self.stream.hand_over(pending.leaves)
        pending.sources.clear()
        return pending.batch

    def iterate(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Yield ``batches`` on the device; batch k+1's copy is issued before batch k is
        yielded, so it overlaps the caller's work on batch k."""
        try:
            pending = self.start(next(batches))
        except StopIteration:
            return
        for host in batches:
            # hand batch k over *before* issuing k+1's copies: wait_stream then covers
            # only k's copies, so the caller's work on k never waits for k+1's copy
            ready = self.finish(pending)
            pending = self.start(host)
            yield ready
        yield self.finish(pending)
