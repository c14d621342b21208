"""Background prefetch of the shards a reader will need next.

A :class:`Prefetcher` runs ``workers`` threads that call ``fetch_one(item)`` for the
items of the latest :meth:`Prefetcher.schedule` call, in order, while the bytes in
flight stay under ``max_in_flight_bytes`` and each item fits the cache's ``headroom()``.
Errors are recorded (:attr:`Prefetcher.errors`), never raised in the background: the
foreground request for the same shard raises them (the disk tier records the FAILED
state). It is generic in the item type; the cache facade schedules shard keys.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastload.errors import ConfigError

__all__ = ["PrefetchStats", "Prefetcher"]

T = TypeVar("T", bound=Hashable)

# Headroom is owned by other processes too, so a worker that found too little of it
# re-reads it this often (a bounded wait, not a spin).
_HEADROOM_RECHECK_S = 0.2
# A thread with nothing to do for this long ends (schedule() starts threads again):
# idle threads would otherwise keep the prefetcher, its cache and the dataset that
# scheduled them alive for the life of the process.
_IDLE_EXIT_S = 2.0


@dataclass(frozen=True)
class PrefetchStats:
    """Counters of a :class:`Prefetcher`."""

    scheduled: int
    started: int
    completed: int
    failed: int
    bytes_completed: int
    pending: int
    in_flight: int
    in_flight_bytes: int


class Prefetcher(Generic[T]):
    """Fetch upcoming items in background threads, bounded by bytes in flight and by
    ``headroom()`` (bytes the cache can take now, already net of downloads in progress,
    as :meth:`DiskTier.evictable_headroom` is; None means unbounded).

    Use as a context manager or call :meth:`close`. Raises :class:`ConfigError` on bad
    arguments.
    """

    def __init__(
        self,
        fetch_one: Callable[[T], object],
        max_in_flight_bytes: int,
        headroom: Callable[[], int] | None = None,
        workers: int = 2,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"Prefetcher workers must be >= 1, got {workers}")
        if max_in_flight_bytes <= 0:
            raise ConfigError(
                f"Prefetcher max_in_flight_bytes must be positive, got {max_in_flight_bytes}"
            )
        self._fetch_one: Callable[[], Callable[[T], object] | None]
        if hasattr(fetch_one, "__self__") and hasattr(fetch_one, "__func__"):
            self._fetch_one = weakref.WeakMethod(fetch_one)
        else:
            self._fetch_one = lambda: fetch_one
        self._max_bytes = max_in_flight_bytes
        self._headroom = headroom
        self._cond = threading.Condition()
        self._pending: list[tuple[T, int]] = []
        self._in_flight: dict[T, int] = {}
        self._errors: dict[T, BaseException] = {}
        self._stop = False
        self._counts = {"scheduled": 0, "started": 0, "completed": 0, "failed": 0, "bytes": 0}
        # threads start as work arrives, up to ``workers`` (each opens its own catalog
        # connection: idle ones are not free)
        self._workers = workers
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schedule(self, upcoming: Sequence[tuple[T, int]]) -> None:
        """Replace the queue with ``upcoming`` (``(item, size)`` pairs, soonest first).
        Items in flight, and items that failed in this prefetcher, are skipped."""
        with self._cond:
            if self._stop:
                return
            seen: set[T] = set()
            queue: list[tuple[T, int]] = []
            for item, size in upcoming:
                if item in seen or item in self._in_flight or item in self._errors:
                    continue
                seen.add(item)
                queue.append((item, int(size)))
            self._pending = queue
            self._counts["scheduled"] += len(queue)
            want = min(self._workers, len(queue) + len(self._in_flight))
            while len(self._threads) < want:
                t = threading.Thread(
                    target=self._run, name=f"fastload-prefetch-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)
            self._cond.notify_all()

    @property
    def errors(self) -> dict[T, BaseException]:
        """Errors of failed items, by item (a copy)."""
        with self._cond:
            return dict(self._errors)

    def forget_error(self, item: T) -> None:
        """Let ``item`` be scheduled again after it failed."""
        with self._cond:
            self._errors.pop(item, None)

    def stats(self) -> PrefetchStats:
        """A snapshot of the counters."""
        with self._cond:
            return PrefetchStats(
                scheduled=self._counts["scheduled"],
                started=self._counts["started"],
                completed=self._counts["completed"],
                failed=self._counts["failed"],
                bytes_completed=self._counts["bytes"],
                pending=len(self._pending),
                in_flight=len(self._in_flight),
                in_flight_bytes=sum(self._in_flight.values()),
            )

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is pending or in flight; returns False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._stop or (not self._pending and not self._in_flight), timeout
            )

    def stop(self) -> None:
        """Stop taking items, without waiting for the threads (an item in flight
        finishes; idle threads end at once)."""
        with self._cond:
            self._stop = True
            self._pending = []
            self._cond.notify_all()

    def in_flight(self) -> set[T]:
        """The items being fetched now."""
        with self._cond:
            return set(self._in_flight)

    def close(self, timeout: float = 60.0) -> bool:
        """Stop taking items and join the threads (an item in flight finishes first).
        Returns whether every thread stopped within ``timeout``."""
        with self._cond:
            self._stop = True
            self._pending = []
            self._cond.notify_all()
        threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
        return not any(t.is_alive() for t in threads)

    # ---------------------------------------------------------------- workers
    def _take(self) -> tuple[T, int] | None:
        """Next item that fits the byte bound, or None to stop. Called with the lock."""
        while not self._stop:
            if self._pending:
                item, size = self._pending[0]
                busy = sum(self._in_flight.values())
                # a lone item larger than the bound still runs, or it would never run
                if not self._in_flight or busy + size <= self._max_bytes:
                    if self._headroom is None:
                        return self._pending.pop(0)
                    self._cond.release()
                    try:
                        room = self._headroom()
                    except Exception:
                        room = 0  # the foreground path will meet the same problem and raise
                    finally:
                        self._cond.acquire()
                    if self._pending and self._pending[0][0] == item and size <= room:
                        return self._pending.pop(0)
                    if self._pending and self._pending[0][0] == item:
                        self._cond.wait(_HEADROOM_RECHECK_S)
                    continue
            if not self._cond.wait(_IDLE_EXIT_S) and not self._pending and not self._stop:
                self._threads.remove(threading.current_thread())  # idle: end
                return None
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                picked = self._take()
                if picked is None:
                    return
                item, size = picked
                self._in_flight[item] = size
                self._counts["started"] += 1
            error: BaseException | None = None
            fetch_one = self._fetch_one()
            try:
                if fetch_one is None:  # its owner is gone: nobody wants the item
                    self.stop()
                else:
                    fetch_one(item)
            except Exception as exc:
                error = exc
            del fetch_one
            with self._cond:
                del self._in_flight[item]
                if error is None:
                    self._counts["completed"] += 1
                    self._counts["bytes"] += size
                else:
                    self._errors[item] = error
                    self._counts["failed"] += 1
                self._cond.notify_all()
