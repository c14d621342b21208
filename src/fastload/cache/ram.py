"""The RAM tier: a byte-budgeted LRU of immutable ``bytes`` values.

It holds what is read without a disk tier (whole shards when no ``cache_dir`` is
given) and small hot objects (index sidecars, manifests). Values are ``bytes``, so an
evicted value a caller still holds stays valid (reference counting plays the part
POSIX unlink plays for the disk tier). :meth:`RamTier.get_or_load` is single-flight
across the threads of a process: one load per key, the others wait with a deadline
and get the loader's error if it fails.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from fastload.cache.policy import Candidate, choose_victims
from fastload.config import parse_size
from fastload.errors import CacheError

__all__ = ["RamTier", "RamTierStats"]


@dataclass
class RamTierStats:
    """Counters of a :class:`RamTier`. ``oversize`` counts values served but not kept
    because they alone exceed the budget."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    oversize: int = 0
    waits: int = 0
    failures: int = 0
    bytes_used: int = 0
    entries: int = 0


class _Flight:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: bytes | None = None
        self.error: BaseException | None = None


class RamTier:
    """An LRU of ``bytes`` values whose sizes sum to at most ``limit`` bytes.

    ``limit`` is bytes or a size string (``"2GB"``). Thread-safe; per process (not
    shared across processes). Raises :class:`ConfigError` on a bad limit.
    """

    def __init__(self, limit: int | str, wait_deadline_s: float = 600.0) -> None:
        self.limit = parse_size(limit, "ram_limit")
        self.wait_deadline_s = wait_deadline_s
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self._used = 0
        self._stats = RamTierStats()
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        # Locks held and loads in flight in the parent's threads at fork time would
        # never finish here: start the child with a fresh lock and no flights.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._flights = {}

    def __len__(self) -> int:
        self._after_fork()
        with self._lock:
            return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        self._after_fork()
        with self._lock:
            return key in self._items

    def get(self, key: Hashable) -> bytes | None:
        """The value of ``key`` (now most recently used), or None; counts a hit or miss."""
        self._after_fork()
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self._stats.misses += 1
                return None
            self._items.move_to_end(key)
            self._stats.hits += 1
            return value

    def put(self, key: Hashable, value: bytes) -> bool:
        """Store ``value`` under ``key``, evicting least-recently-used values to fit.
        Returns False (and stores nothing) if ``value`` alone exceeds the limit."""
        self._after_fork()
        value = bytes(value) if not isinstance(value, bytes) else value
        with self._lock:
            return self._put_locked(key, value)

    def _put_locked(self, key: Hashable, value: bytes) -> bool:
        old = self._items.pop(key, None)
        if old is not None:
            self._used -= len(old)
        if len(value) > self.limit:
            self._stats.oversize += 1
            return False
        keys = list(self._items)
        victims, _ = choose_victims(
            (Candidate(str(i), len(self._items[k]), float(i)) for i, k in enumerate(keys)),
            len(value),
            self.limit,
        )
        for name in victims:
            evicted = self._items.pop(keys[int(name)])
            self._used -= len(evicted)
            self._stats.evictions += 1
            self._stats.bytes_evicted += len(evicted)
        self._items[key] = value
        self._used += len(value)
        return True

    def get_or_load(self, key: Hashable, load: Callable[[], bytes]) -> bytes:
        """Return the value of ``key``, calling ``load()`` once if it is absent, however
        many threads ask at once. Raises :class:`CacheError` (with the loader's error as
        cause) to the loader and to every thread that waited for it, or when the wait
        passes the deadline."""
        self._after_fork()
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                self._stats.hits += 1
                return value
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
                self._stats.misses += 1
            else:
                self._stats.waits += 1
        if not leader:
            if not flight.done.wait(self.wait_deadline_s):
                raise CacheError(
                    f"timed out after {self.wait_deadline_s} s waiting for another thread to "
                    f"load {key!r} into the RAM tier"
                )
            if flight.error is not None:
                raise CacheError(
                    f"loading {key!r} into the RAM tier failed in another thread: {flight.error}"
                ) from flight.error
            assert flight.value is not None
            with self._lock:
                self._stats.hits += 1
            return flight.value
        try:
            value = bytes(load())
        except BaseException as exc:
            flight.error = exc
            with self._lock:
                self._stats.failures += 1
                del self._flights[key]
            flight.done.set()
            if isinstance(exc, CacheError):
                raise
            if isinstance(exc, Exception):
                raise CacheError(f"loading {key!r} into the RAM tier failed: {exc}") from exc
            raise
        flight.value = value
        with self._lock:
            self._stats.loads += 1
            self._stats.bytes_loaded += len(value)
            self._put_locked(key, value)
            del self._flights[key]
        flight.done.set()
        return value

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` if present."""
        self._after_fork()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._used -= len(old)

    def clear(self) -> None:
        """Forget every value."""
        self._after_fork()
        with self._lock:
            self._items.clear()
            self._used = 0

    def stats(self) -> RamTierStats:
        """A snapshot of the counters with the current ``bytes_used`` and ``entries``."""
        self._after_fork()
        with self._lock:
            return replace(self._stats, bytes_used=self._used, entries=len(self._items))

    def headroom(self) -> int:
        """Bytes that fit without evicting anything."""
        self._after_fork()
        with self._lock:
            return max(self.limit - self._used, 0)
