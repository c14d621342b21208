"""Per-entry locks that work across threads and processes.

A thread first takes a process-local :class:`threading.Lock` for the entry (so
threads of one process block without polling), then an exclusive ``fcntl.flock`` on
the entry's lock file (so processes exclude each other; the kernel drops it when the
holder dies, which is what makes a crashed download recoverable). Waiting for the
flock polls with exponential backoff, bounded by the caller's deadline.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastload.errors import CacheError

__all__ = ["EntryLocks", "LockTimeout"]

_MAX_BACKOFF_S = 0.05


class LockTimeout(CacheError):
    """Waiting for another download of the same entry passed the deadline."""


class EntryLocks:
    """Lock files ``<lock_dir>/<flat name>.lock`` plus matching in-process locks."""

    def __init__(self, lock_dir: Path) -> None:
        self.lock_dir = lock_dir
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._locks: dict[str, threading.Lock] = {}

    def _thread_lock(self, flat: str) -> threading.Lock:
        with self._mutex:
            if self._pid != os.getpid():
                # locks held by threads of the parent at fork time would never be released
                self._pid = os.getpid()
                self._locks = {}
            return self._locks.setdefault(flat, threading.Lock())

    def path(self, flat: str) -> Path:
        """The lock file of the entry ``flat``."""
        return self.lock_dir / f"{flat}.lock"

    @contextmanager
    def hold(self, flat: str, deadline: float, what: str) -> Iterator[float]:
        """Hold the entry's lock; yields the seconds spent waiting for another holder
        (0.0 if the lock was free).

        ``deadline`` is a :func:`time.monotonic` instant. Raises :class:`LockTimeout`
        naming ``what`` if the lock is not had by then.
        """
        t0 = time.monotonic()
        tl = self._thread_lock(flat)
        waited = not tl.acquire(blocking=False)
        if waited and not tl.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise LockTimeout(
                f"timed out after {time.monotonic() - t0:.1f} s waiting for another thread's "
                f"download of {what}"
            )
        try:
            fd = os.open(self.path(flat), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                delay = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        waited = True
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise LockTimeout(
                                f"timed out after {time.monotonic() - t0:.1f} s waiting for "
                                f"another process's download of {what} (lock {self.path(flat)})"
                            ) from None
                        time.sleep(min(delay, remaining))
                        delay = min(delay * 2, _MAX_BACKOFF_S)
                yield time.monotonic() - t0 if waited else 0.0
            finally:
                os.close(fd)
        finally:
            tl.release()

    @contextmanager
    def try_hold(self, flat: str) -> Iterator[bool]:
        """Take the entry's lock if nobody holds it; yields whether it was taken."""
        tl = self._thread_lock(flat)
        if not tl.acquire(blocking=False):
            yield False
            return
        try:
            fd = os.open(self.path(flat), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)
        finally:
            tl.release()
