"""Publishing for the NVMe tier (:mod:`fastload.cache.disk`): an entry is fetched, under
its entry lock and a reservation, into a part file ``tmp/<flat name>.<pid>.<token>.part``
(``O_EXCL``, 0600, never through a symlink), its size and xxh3-128 checked (by the
digest the fetch took as it wrote, else by reading it back), made read-only, pinned,
``os.replace``d into ``data/`` and marked READY. A failure is recorded as FAILED (with
a message naming a full device); a cancelled download returns the entry to ABSENT.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
from contextlib import suppress
from pathlib import Path

from fastload._fs import make_dirs, open_nofollow
from fastload.cache._entries import EntryKey, FetchFn, Pin, fd_checksum, open_dir
from fastload.cache._room import TierRoom
from fastload.cache.catalog import EntryState
from fastload.errors import CacheError, CacheFullError, FastloadError
from fastload.shards.checksum import Xxh3Hasher, check

_READ_ONLY = 0o400
_READ_ONLY_SHARED = 0o440


class TierPublishing(TierRoom):
    """Fetch an entry into a part file, verify it and publish it atomically."""

    def _fetch_locked(
        self, key: EntryKey, size: int, fetch: FetchFn, path: Path, room_wait_s: float | None
    ) -> Pin:
        name = key.name
        entry = (name, key.dataset, key.shard, key.checksum, size)  # its catalog row
        evicted, freed = self._reserve(key, size, room_wait_s)
        self._count(misses=1, fetches=1, evictions=evicted, bytes_evicted=freed)
        tmp = self.tmp_dir / f"{key.flat}.{os.getpid()}.{secrets.token_hex(4)}.part"
        pin: Pin | None = None
        try:
            digest = _write_temp(tmp, fetch, self.shared, sync=self.sync_publish)
            fd = open_nofollow(tmp, os.O_RDONLY, shared=self.shared)
            try:
                if (
                    isinstance(digest, Xxh3Hasher)
                    and digest.nbytes == size
                    and os.fstat(fd).st_size == size
                ):
                    # every byte of the file, hashed in order as the fetch wrote it
                    got_size, got = size, digest.hexdigest_tagged()
                    self._count(hashed_on_arrival=1)
                else:
                    got_size, got = fd_checksum(fd)
                check(f"{key} fetched into {tmp}", size, key.checksum, got_size, got)
                os.fchmod(fd, _READ_ONLY_SHARED if self.shared else _READ_ONLY)
                fcntl.flock(fd, fcntl.LOCK_SH)  # our pin, taken before it is visible
                pin = Pin(fd, path, size)
            except BaseException:
                if pin is None:
                    os.close(fd)
                raise
            self._publish_dir(path.parent)
            os.replace(tmp, path)
            if self.sync_publish:
                _fsync_dir(path.parent)
            with self._txn() as conn:
                boot = None if self.sync_publish else self.boot
                self.catalog.put(conn, *entry, EntryState.READY, boot=boot)
                self.catalog.bump(conn, bytes_fetched=size)
        except BaseException as exc:
            if pin is not None:
                pin.release()
            with suppress(OSError):
                tmp.unlink()
            with suppress(OSError):
                path.unlink()
            if not isinstance(exc, Exception):
                # cancelled (KeyboardInterrupt, SystemExit, CancelledError): this caller
                # gave up, the entry did not fail; back to ABSENT, so that waiters fetch
                # it themselves instead of receiving an error
                with suppress(FastloadError), self._txn() as conn:
                    self.catalog.delete(conn, name, EntryState.FETCHING)
                raise
            message = self._describe_failure(key, exc)
            with suppress(FastloadError), self._txn() as conn:
                self.catalog.put(conn, *entry, EntryState.FAILED, error=message)
                self.catalog.bump(conn, failures=1)
            self._count(failures=1)
            if _out_of_space(exc):
                # the device is full below the cap (another tenant filled it): a full
                # cache, which the facade reads around (or raises, with on_full="raise")
                raise CacheFullError(message) from exc
            raise CacheError(message) from exc
        self._count(bytes_fetched=size)
        return pin

    def _publish_dir(self, directory: Path) -> None:
        """Create ``data/<dataset>/`` if needed (0700, checked, fsynced into ``data/``)."""
        if os.path.lexists(directory):
            return
        make_dirs(directory, top=self.root, shared=self.shared)
        _fsync_dir(self.data_dir)

    def _describe_failure(self, key: EntryKey, exc: BaseException) -> str:
        if _out_of_space(exc):
            return (
                f"no space left on the cache device while fetching {key} ({key.shard}) into "
                f"{self.root}: free space there or lower cache_limit"
            )
        return f"fetching {key} into {self.root} failed: {type(exc).__name__}: {exc}"


def _out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the device running out of space."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "database or disk is full" in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


#: Descriptors of temp files whose download was cancelled, now pointing at /dev/null.
_PARKED: list[int] = []


def _write_temp(tmp: Path, fetch: FetchFn, shared: bool, sync: bool = True) -> object:
    """Create ``tmp`` (``O_EXCL``, never through a symlink, 0600) and let ``fetch`` write
    it; fsync it if ``sync``. Returns what ``fetch`` returned.

    When ``fetch`` is cancelled (KeyboardInterrupt, SystemExit, CancelledError) its
    writers may not all have stopped: a thread it started can still hold the number of
    this descriptor. Closing it would let the next ``open()`` of the process reuse the
    number and receive the download's bytes, so the number is parked instead: pointed
    at ``/dev/null`` with ``dup2`` and kept open for the life of the process (one
    descriptor per cancelled download)."""
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, shared=shared)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            digest = fetch(f)
        if sync:
            os.fsync(fd)
    except BaseException as exc:
        if isinstance(exc, Exception):
            os.close(fd)
        else:
            _park(fd)
        raise
    os.close(fd)
    return digest


def _park(fd: int) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        os.close(fd)
        return
    try:
        os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    _PARKED.append(fd)


def _fsync_dir(path: Path) -> None:
    fd = open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
