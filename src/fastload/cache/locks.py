"""Per-entry locks that work across threads, processes, PID namespaces and ``fork``.

A thread first takes a process-local :class:`threading.Lock` for the entry (so threads
of one process block without polling), then an exclusive ``fcntl.flock`` on the entry's
lock file (so processes exclude each other, in any PID namespace: the lock lives in the
kernel's open file, not in a PID; the kernel drops it when the holder dies, which is
what makes a crashed download recoverable).

A request that finds the flock taken waits in a *blocking* ``flock`` run by a helper
thread, so it wakes the moment the holder releases it (no polling, no backoff), while
the caller waits for the helper with its deadline and stays interruptible. A helper
whose caller gave up (deadline, Ctrl-C) releases the lock as soon as it gets it.

Every lock is released explicitly (``LOCK_UN``) by the process that took it. A flock
belongs to the open file, which ``fork`` shares with the child: so every descriptor
this module (or a pin, :func:`forget_in_child`) has open is closed in a forked child
right after the fork (without ``LOCK_UN``, which would release the parent's lock), and
a child never keeps an entry locked for its lifetime.

**Heartbeat: a stopped holder stalls nobody.** A flock is released only when its
holder dies; a holder stopped with SIGSTOP (a debugger, a frozen container) or hung
keeps it. So a holder's process beats: a daemon thread touches the mtime of every lock
file the process holds every :data:`BEAT_S` seconds (and the moment it gets one). A
waiter that sees no beat for ``lease_s`` seconds, having itself waited at least two
beats, stops waiting with :class:`LeaseExpired` (so the first waiter on a stopped
holder waits at most ``lease_s`` + a look, later ones about two beats); the caller
then reads the entry without the lock (the disk tier streams it uncached, touching
nothing of the holder's), and the holder, once continued, finishes and publishes as if
nothing happened.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from fastload._fs import open_nofollow
from fastload.errors import CacheError, LeaseExpired, LockTimeout

__all__ = [
    "BEAT_S",
    "NO_LOCK_ERRNOS",
    "EntryLocks",
    "LeaseExpired",
    "LockTimeout",
    "flock_failure",
    "forget_in_child",
    "remember_until_fork",
    "try_flock",
    "unlock_and_close",
]


#: How often a process touches the lock files it holds (its heartbeat).
BEAT_S = 1.0
#: How often a waiter looks at the holder's heartbeat.
_LOOK_S = 0.25


#: What ``flock`` fails with on a filesystem that cannot lock (some network
#: filesystems; an NFS mount whose lock service is gone).
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def flock_failure(cache_dir: Path, err: int, detail: str) -> CacheError:
    """The error for ``flock`` failing with errno ``err`` in the cache directory
    ``cache_dir`` (``detail``: the file and the system's message). An errno of
    :data:`NO_LOCK_ERRNOS` says the filesystem cannot lock: the cache cannot be shared
    safely there (processes would publish over and evict each other's files), so the
    error says where to put it instead; anything else is reported as it is."""
    if err in NO_LOCK_ERRNOS:
        return CacheError(
            f"the filesystem of the cache directory {cache_dir} does not support flock "
            f"({detail}): fastload needs it to share the cache between processes; put "
            "cache_dir on a local filesystem (ext4, xfs, tmpfs), or pass none to cache in RAM"
        )
    return CacheError(f"cannot lock a file in the cache directory {cache_dir}: {detail}")


def try_flock(fd: int, operation: int, cache_dir: Path, path: str | os.PathLike[str]) -> bool:
    """``flock(fd, operation)`` on the file ``path`` in the cache directory
    ``cache_dir``: True when taken, False when another process holds it (only with
    ``LOCK_NB``). Any other failure (locking broken mid-run: an NFS lock service gone)
    raises :func:`flock_failure`'s :class:`CacheError` naming the directory, never a
    bare :class:`OSError`; ``fd`` stays open either way (the caller closes it)."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        if not operation & fcntl.LOCK_NB:
            raise
        return False
    except OSError as exc:
        detail = f"{os.fspath(path)}: {exc.strerror or exc}"
        raise flock_failure(cache_dir, exc.errno or 0, detail) from exc
    return True


# ------------------------------------------------------------------ fork safety
_FORK_FDS: set[int] = set()
_FORK_MUTEX = threading.Lock()


def remember_until_fork(fd: int) -> None:
    """Close ``fd`` in every child forked while it is registered (see the module doc)."""
    with _FORK_MUTEX:
        _FORK_FDS.add(fd)


def forget_in_child(fd: int) -> None:
    """Stop closing ``fd`` in forked children (call before this process closes it)."""
    with _FORK_MUTEX:
        _FORK_FDS.discard(fd)


def _after_fork_in_child() -> None:
    global _FORK_MUTEX
    _FORK_MUTEX = threading.Lock()  # a parent thread may have held it at fork time
    for fd in list(_FORK_FDS):
        with suppress(OSError):
            os.close(fd)
    _FORK_FDS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def unlock_and_close(fd: int, pid: int) -> None:
    """Unlock and close ``fd`` if this process (``pid``) opened it (in a forked child
    the number was already closed after the fork and may belong to another file by
    now)."""
    if os.getpid() != pid:
        return
    forget_in_child(fd)
    try:
        # a filesystem that cannot lock refuses the unlock too: closing the last
        # descriptor of the open file releases the lock anyway
        with suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class _Heart:
    """The heartbeat of this process: touches the lock files it holds (see the module
    docstring). One daemon thread, started with the first lock held."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._held: dict[int, int] = {}  # fd -> how many holds
        self._thread: threading.Thread | None = None

    def add(self, fd: int) -> None:
        _touch(fd)
        with self._mutex:
            self._held[fd] = self._held.get(fd, 0) + 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fastload-lock-heartbeat", daemon=True
                )
                self._thread.start()

    def remove(self, fd: int) -> None:
        with self._mutex:
            n = self._held.get(fd, 0) - 1
            if n > 0:
                self._held[fd] = n
            else:
                self._held.pop(fd, None)

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_S)
            with self._mutex:
                if not self._held:
                    self._thread = None
                    return
                for fd in self._held:
                    _touch(fd)


def _touch(fd: int) -> None:
    with suppress(OSError):
        os.utime(fd)


_HEART = _Heart()
os.register_at_fork(after_in_child=_HEART._reset)


def _stalled(fd: int, since: float, lease_s: float) -> bool:
    """Whether the holder of the lock file ``fd`` has not beaten for ``lease_s``, seen
    by a waiter that started at ``since`` (a :func:`time.time` instant) and has waited
    at least two beats (a new holder beats the moment it has the lock: a beat older
    than this waiter is its predecessor's only for those microseconds)."""
    try:
        beat = os.fstat(fd).st_mtime
    except OSError:
        return False
    now = time.time()
    return now - since >= min(lease_s, 2 * BEAT_S) and now - beat > lease_s


def _wait_flock(fd: int, deadline: float, lease_s: float | None = None) -> str:
    """Block in ``flock(fd, LOCK_EX)`` on a helper thread until it is granted
    (``"got"``), ``deadline`` passes (``"timeout"``) or, with ``lease_s``, the holder
    has not beaten for that long (``"stalled"``); raises the helper's :class:`OSError`
    when ``flock`` failed (rather than calling that a timeout). Interrupts of the caller
    propagate; in every case but the first the helper, once granted, unlocks at once
    since nobody wants the lock any more."""
    helper_fd = os.dup(fd)
    remember_until_fork(helper_fd)
    state = {"got": False, "abandoned": False}
    failed: list[OSError] = []
    mutex = threading.Lock()
    done = threading.Event()

    def run() -> None:
        got = False
        try:
            fcntl.flock(helper_fd, fcntl.LOCK_EX)
            got = True
        except OSError as exc:
            failed.append(exc)  # the filesystem cannot lock (or broke): the caller's
        with mutex:
            if got and state["abandoned"]:
                with suppress(OSError):
                    fcntl.flock(helper_fd, fcntl.LOCK_UN)
                got = False
            state["got"] = got
            done.set()
        forget_in_child(helper_fd)
        os.close(helper_fd)

    threading.Thread(target=run, name="fastload-lock-wait", daemon=True).start()
    since = time.time()
    outcome = "timeout"
    try:
        while not done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(min(left, _LOOK_S))  # timed, so that Ctrl-C reaches the caller
            if lease_s is not None and not done.is_set() and _stalled(fd, since, lease_s):
                outcome = "stalled"
                break
    finally:
        with mutex:
            if not done.is_set():
                state["abandoned"] = True
    if failed and not state["got"]:
        raise failed[0]
    return "got" if state["got"] else outcome


class EntryLocks:
    """Lock files ``<lock_dir>/<flat name>.lock`` plus matching in-process locks.

    Lock files are opened with ``O_NOFOLLOW`` (a planted symlink is refused) and
    created 0600 (0660 when ``shared``)."""

    def __init__(self, lock_dir: Path, shared: bool = False) -> None:
        self.lock_dir = lock_dir
        self.shared = shared
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._locks: dict[str, threading.Lock] = {}

    def _thread_lock(self, flat: str) -> threading.Lock:
        if self._pid != os.getpid():
            # locks held by threads of the parent at fork time would never be released
            self._pid, self._mutex, self._locks = os.getpid(), threading.Lock(), {}
        with self._mutex:
            return self._locks.setdefault(flat, threading.Lock())

    def path(self, flat: str) -> Path:
        """The lock file of the entry ``flat``."""
        return self.lock_dir / f"{flat}.lock"

    def _failure(self, flat: str, exc: OSError) -> CacheError:
        detail = f"{self.path(flat)}: {exc.strerror or exc}"
        return flock_failure(self.lock_dir.parent, exc.errno or 0, detail)

    def _open(self, flat: str) -> int:
        fd = open_nofollow(self.path(flat), os.O_RDWR | os.O_CREAT, shared=self.shared)
        remember_until_fork(fd)
        return fd

    @contextmanager
    def hold(
        self, flat: str, deadline: float, what: str, lease_s: float | None = None
    ) -> Iterator[float]:
        """Hold the entry's lock; yields the seconds spent waiting for another holder
        (0.0 if the lock was free). While held, this process's heartbeat touches the
        lock file.

        ``deadline`` is a :func:`time.monotonic` instant. Raises :class:`LockTimeout`
        naming ``what`` if the lock is not had by then, :class:`LeaseExpired` if
        another process holds it and has not beaten for ``lease_s`` seconds.
        """
        t0 = time.monotonic()
        tl = self._thread_lock(flat)
        waited = not tl.acquire(blocking=False)
        if waited and not tl.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise LockTimeout(
                f"timed out after {time.monotonic() - t0:.1f} s waiting for another thread's "
                f"download of {what}"
            )
        with self._lock_file(flat, tl) as (fd, free):
            if not free:
                waited = True
                try:
                    outcome = _wait_flock(fd, deadline, lease_s)
                except OSError as exc:
                    raise self._failure(flat, exc) from exc
                if outcome == "stalled":
                    raise LeaseExpired(
                        f"the process downloading {what} has not shown a heartbeat for "
                        f"{lease_s:.0f} s (stopped or hung; lock {self.path(flat)})"
                    )
                if outcome != "got":
                    raise LockTimeout(
                        f"timed out after {time.monotonic() - t0:.1f} s waiting for "
                        f"another process's download of {what} (lock {self.path(flat)})"
                    )
            _HEART.add(fd)
            try:
                yield time.monotonic() - t0 if waited else 0.0
            finally:
                _HEART.remove(fd)

    @contextmanager
    def try_hold(self, flat: str) -> Iterator[bool]:
        """Take the entry's lock if nobody holds it; yields whether it was taken."""
        tl = self._thread_lock(flat)
        if not tl.acquire(blocking=False):
            yield False
            return
        with self._lock_file(flat, tl) as (_, free):
            yield free

    @contextmanager
    def _lock_file(self, flat: str, tl: threading.Lock) -> Iterator[tuple[int, bool]]:
        """With the entry's thread lock ``tl`` taken by the caller: yields the entry's
        lock file, open, and whether its flock was free (then it is held); afterwards
        unlocks and closes the file and releases ``tl`` (in this process only)."""
        pid = os.getpid()
        try:
            fd = self._open(flat)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    free = True
                except BlockingIOError:
                    free = False
                except OSError as exc:
                    raise self._failure(flat, exc) from exc
                yield fd, free
            finally:
                unlock_and_close(fd, pid)
        finally:
            if os.getpid() == pid:
                tl.release()
