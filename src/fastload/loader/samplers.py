"""The caller's ``sampler=`` or ``batch_sampler=`` under :class:`~fastload.DataLoader`,
with torch's semantics, counted and resumable.

torch's rules hold: ``batch_sampler`` is mutually exclusive with ``batch_size``,
``shuffle``, ``sampler`` and ``drop_last``; ``sampler`` with ``shuffle``; an
``IterableDataset`` takes neither (:func:`check_sampler_arguments` raises
:class:`~fastload.errors.ConfigError` at construction). A ``sampler`` is batched by
torch's ``BatchSampler(sampler, batch_size, drop_last)``. The loader does not split
such an order over ranks: the sampler does (``DistributedSampler``, a
repeated-augmentation sampler).

:class:`CallerOrder` is what torch's loader iterates in place of the batch sampler.
Every index list it hands torch waits in a queue until its batch reaches the caller;
then it counts (``stats()`` counts samples as the number of indices per batch,
whatever the batch's structure) and joins a running digest of the epoch's consumed
batches. Resume:

* **In the same process** (a ``break`` and a new ``iter()``, or ``set_epoch`` with the
  current epoch): the lists the sampler yielded but the caller never got are replayed
  first, then the *same* sampler iterator continues. Exact for every sampler.
* **From a state** (:meth:`~fastload.DataLoader.load_state_dict`): the state holds
  the sampler's own ``epoch`` attribute as it was when the epoch began (torch's
  ``DistributedSampler`` and torchvision's samplers have one); loading sets it back
  with ``set_epoch`` on the sampler, the batch sampler and the batch sampler's
  ``sampler`` (where they define it). The next ``iter()`` iterates the epoch afresh,
  skips the consumed batches without loading them and compares their digest with the
  saved one. Exact when the sampler's order
  is a function of its arguments and the epoch (``SequentialSampler``,
  ``DistributedSampler(seed=...)``, ``GroupedBatchSampler`` over either, a seeded
  repeated-augmentation sampler); a sampler drawing from a global or advancing random
  generator (``RandomSampler()`` without a fresh ``generator``) gives other batches,
  and the resume raises :class:`~fastload.errors.ConfigError` naming the sampler
  instead of silently repeating or skipping samples. A state at an epoch boundary
  always loads (nothing to skip).

As in torch, iterating never calls the sampler's ``set_epoch``: the caller drives it
(``sampler.set_epoch(epoch)``, as torchvision's references do), or calls
:meth:`fastload.DataLoader.set_epoch`, which passes it on.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch.utils.data

from fastload.errors import ConfigError

__all__ = [
    "CallerOrder",
    "batching",
    "caller_order",
    "check_sampler_arguments",
    "load_order_state",
    "order_indices",
    "sampler_state_mismatch",
]


def check_sampler_arguments(
    dataset: Any,
    *,
    batch_size: Any,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
) -> None:
    """Raise :class:`ConfigError` where torch's DataLoader raises ``ValueError`` for
    ``sampler``/``batch_sampler`` (mutually exclusive arguments, an iterable dataset),
    and for a sampler that is not iterable."""
    if sampler is None and batch_sampler is None:
        return
    given = "batch_sampler" if batch_sampler is not None else "sampler"
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise ConfigError(
            f"fastload.DataLoader: an IterableDataset orders itself; it takes no {given} "
            f"(got {type(batch_sampler if batch_sampler is not None else sampler).__name__})"
        )
    if batch_sampler is not None:
        clash = [
            name
            for name, bad in (
                ("batch_size", batch_size not in (1, None)),
                ("shuffle", bool(shuffle)),
                ("sampler", sampler is not None),
                ("drop_last", bool(drop_last)),
            )
            if bad
        ]
        if clash:
            raise ConfigError(
                "fastload.DataLoader: batch_sampler is mutually exclusive with batch_size, "
                f"shuffle, sampler and drop_last (as in torch); also given: {', '.join(clash)}"
            )
    elif shuffle:
        raise ConfigError(
            "fastload.DataLoader: sampler is mutually exclusive with shuffle (as in torch): "
            "the sampler decides the order"
        )
    for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value is not None and not callable(getattr(value, "__iter__", None)):
            raise ConfigError(
                f"fastload.DataLoader: {name} must be iterable, got {type(value).__name__}"
            )


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _batch_bytes(indices: Iterable[Any]) -> bytes:
    items = list(indices)
    try:
        return np.asarray([int(i) for i in items], dtype=np.int64).tobytes()
    except (TypeError, ValueError):
        return repr(items).encode()  # keys of a dataset indexed by other things


class CallerOrder(torch.utils.data.Sampler[list[Any]]):
    """The caller's ``batch_sampler`` (or torch's ``BatchSampler`` over its
    ``sampler``) as torch's loader iterates it: counted, replayable, resumable (see
    the module). ``sampler``: what ``DataLoader.sampler`` reads (the caller's
    ``sampler``, or the batch sampler's own ``sampler`` attribute)."""

    def __init__(
        self, *, sampler: Any, batch_sampler: Any, batch_size: int, drop_last: bool
    ) -> None:
        self.kind = "batch_sampler" if batch_sampler is not None else "sampler"
        if batch_sampler is not None:
            self.batches: Any = batch_sampler
            self.sampler: Any = getattr(batch_sampler, "sampler", None)
        else:
            self.batches = torch.utils.data.BatchSampler(sampler, batch_size, drop_last)
            self.sampler = sampler
        self.given = batch_sampler if batch_sampler is not None else sampler
        self._lock = threading.Lock()
        self._pending: deque[list[Any]] = deque()  # yielded to torch, not yet consumed
        self._live: Iterator[Any] | None = None
        self._serial = 0  # which iteration may pull from _live
        self._epoch = -1
        self._count = 0  # batches of the epoch consumed
        self._digest = hashlib.blake2b(digest_size=16)
        self._expected: str | None = None  # a loaded state's digest, checked on start
        self._sampler_epoch: int | None = None  # the sampler's epoch when this one began

    # ------------------------------------------------------------------ epochs
    def __len__(self) -> int:
        """Batches per epoch (TypeError where the batch sampler has no length)."""
        return len(self.batches)

    def epoch_length(self) -> int | None:
        """:meth:`__len__`, or None for a sampler without a length."""
        try:
            return len(self.batches)
        except TypeError:
            return None

    def _parts(self) -> list[Any]:
        parts: list[Any] = []
        for obj in (self.given, self.batches, self.sampler):
            if obj is not None and all(obj is not p for p in parts):
                parts.append(obj)
        return parts

    def set_epoch(self, epoch: int, *, restart: bool = False) -> None:
        """Pass ``epoch`` on to ``set_epoch`` of the sampler, the batch sampler and the
        batch sampler's ``sampler``, where they define it; ``restart``: the loader
        moved to another epoch (the next start iterates afresh)."""
        if restart:
            self.end_epoch()
        for obj in self._parts():
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)

    def sampler_epoch(self) -> int | None:
        """The first integer ``epoch`` attribute of the sampler, the batch sampler or
        the batch sampler's ``sampler``, or None."""
        for obj in self._parts():
            value = getattr(obj, "epoch", None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def start(self, epoch: int, consumed: int) -> None:
        """Prepare the next iteration: batch ``consumed`` of ``epoch`` on. Continues the
        live iteration when it is at that point; else iterates the epoch afresh
        (at the sampler's current epoch), skipping ``consumed`` batches unloaded and
        checking them against a loaded state's digest. Raises :class:`ConfigError` when
        they differ."""
        with self._lock:
            self._serial += 1
            if self._live is not None and self._epoch == epoch and self._count == consumed:
                return  # the pending lists, then the same iterator
            self._pending.clear()
            self._sampler_epoch = self.sampler_epoch()
            self._live = iter(self.batches)
            self._epoch, self._count = epoch, 0
            digest = hashlib.blake2b(digest_size=16)
            for k in range(consumed):
                indices = next(self._live, None)
                if indices is None:
                    self._live = None  # a retry starts afresh and raises again
                    raise ConfigError(
                        f"fastload.DataLoader: the {self.kind} ({_type_name(self.given)}) "
                        f"yielded {k} batches of epoch {epoch}; the state has {consumed} "
                        "consumed"
                    )
                digest.update(_batch_bytes(indices) + b";")
            expected = self._expected
            if consumed and expected is not None and digest.hexdigest() != expected:
                self._live = None  # and the digest stays expected: a retry raises again
                raise ConfigError(
                    f"fastload.DataLoader: cannot resume epoch {epoch} at batch {consumed}: "
                    f"the {self.kind} ({_type_name(self.given)}) yields other batches than "
                    "it did before the save, so its order is not a function of its "
                    "arguments and the epoch (e.g. RandomSampler without a freshly seeded "
                    "generator); make it deterministic (DistributedSampler(seed=...), a "
                    "seed and set_epoch) or resume at an epoch boundary"
                )
            self._digest, self._count, self._expected = digest, consumed, None

    def remaining(self) -> list[list[Any]]:
        """Materialise the rest of the epoch (the pending lists first), for a schedule
        of the shards it reads; the iteration then yields exactly these."""
        with self._lock:
            rest = list(self._pending)
            if self._live is not None:
                rest += [list(b) for b in self._live]
            self._pending = deque(rest)
            self._live = iter(())
        return rest

    def __iter__(self) -> Iterator[list[Any]]:
        # the pending lists stay queued while they are replayed (popped as their
        # batches reach the caller), so an iteration dropped mid-replay loses none
        with self._lock:
            serial = self._serial
            replay = list(self._pending)
        for indices in replay:
            with self._lock:
                if serial != self._serial:
                    return  # a newer iteration owns the order
            yield indices
        while True:
            with self._lock:
                if serial != self._serial or self._live is None:
                    return
                got = next(self._live, None)
                if got is None:
                    return
                indices = list(got)
                self._pending.append(indices)
            yield indices

    # ----------------------------------------------------------------- consumed
    def consumed(self) -> int:
        """The caller got the next batch: count it into the digest; returns its
        number of samples (indices). 0 if torch yielded a batch this order did not
        (never expected)."""
        try:
            indices = self._pending.popleft()
        except IndexError:
            return 0
        self._digest.update(_batch_bytes(indices) + b";")
        self._count += 1
        return len(indices)

    def end_epoch(self) -> None:
        """The epoch is over (or another one was set): the next start iterates afresh."""
        with self._lock:
            self._live = None
            self._pending.clear()
            self._count = 0
            self._digest = hashlib.blake2b(digest_size=16)
            self._expected = None

    # -------------------------------------------------------------------- state
    def state(self, consumed: int) -> dict[str, Any]:
        """This order's part of the loader state, at ``consumed`` batches."""
        digest = self._digest.hexdigest() if consumed else ""
        epoch = self._sampler_epoch if self._live is not None else self.sampler_epoch()
        return {
            "kind": self.kind,
            "type": _type_name(self.given),
            "digest": digest,
            "sampler_epoch": epoch if consumed else None,
        }

    def load(self, saved: Mapping[str, Any], consumed: int) -> None:
        """Take a loaded state's part (checked by :func:`sampler_state_mismatch`
        first): mid-epoch, the sampler's epoch goes back to the saved one and the next
        start skips ``consumed`` batches and checks their digest."""
        self.end_epoch()
        self._expected = str(saved.get("digest", "")) if consumed else None
        epoch = saved.get("sampler_epoch")
        if consumed and isinstance(epoch, int):
            self.set_epoch(epoch)


def sampler_state_mismatch(
    order: CallerOrder | None, saved: Any, consumed: int
) -> ConfigError | None:
    """The error for a state whose order does not fit this loader's (a state of the
    loader's own order into one with a caller's sampler, or the reverse, or another
    kind or class of sampler), else None. A state at an epoch boundary fits any."""
    if consumed == 0:
        return None
    if order is None:
        if saved:
            return ConfigError(
                f"loader state was saved with a {saved.get('kind')} "
                f"({saved.get('type')}); this loader orders itself: pass the same one"
            )
        return None
    if not isinstance(saved, Mapping) or not saved:
        return ConfigError(
            f"loader state was saved by a loader ordering itself; this one has a "
            f"{order.kind} ({_type_name(order.given)}): the batches would differ"
        )
    mine = order.state(0)
    for name in ("kind", "type"):
        if saved.get(name) != mine[name]:
            return ConfigError(
                f"loader state was saved with {saved.get('kind')} {saved.get('type')}; "
                f"this loader has {mine['kind']} {mine['type']}: the batches would differ"
            )
    return None


def load_order_state(order: CallerOrder | None, saved: Any, consumed: int) -> None:
    """Give ``order`` its part of a loaded state (``saved``: the state's ``"sampler"``
    entry) after checking that it fits. Raises :class:`ConfigError` when it does not
    (:func:`sampler_state_mismatch`)."""
    error = sampler_state_mismatch(order, saved, consumed)
    if error is not None:
        raise error
    if order is not None:
        order.load(saved if isinstance(saved, Mapping) else {}, consumed)


def order_indices(order: CallerOrder) -> tuple[np.ndarray, int] | None:
    """The indices the rest of ``order``'s epoch reads, flat, and its first batch's
    size (what the cache transport's shard schedule needs), or None for a sampler
    without a length (it may be endless: nothing is materialised)."""
    if order.epoch_length() is None:
        return None
    rest = order.remaining()
    try:
        flat = np.asarray([int(i) for b in rest for i in b], dtype=np.int64)
    except (TypeError, ValueError):
        return None
    return flat, max(1, len(rest[0]) if rest else 1)


def caller_order(
    sampler: Any, batch_sampler: Any, batch_size: int, drop_last: bool
) -> CallerOrder | None:
    """The :class:`CallerOrder` of the (checked) ``sampler``/``batch_sampler``
    arguments, or None when neither was given (the loader orders itself)."""
    if sampler is None and batch_sampler is None:
        return None
    return CallerOrder(
        sampler=sampler, batch_sampler=batch_sampler, batch_size=batch_size, drop_last=drop_last
    )


def batching(
    order: CallerOrder | None, sampler: Any, batch_size: int, drop_last: bool
) -> dict[str, Any]:
    """The batching keywords for torch's loader: the caller's order as its
    ``batch_sampler``, else the loader's own ``sampler`` with ``batch_size`` and
    ``drop_last``."""
    if order is not None:
        return {"batch_sampler": order}
    return {"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last}
