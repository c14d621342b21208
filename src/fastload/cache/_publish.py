"""Publishing for the NVMe tier (:mod:`fastload.cache.disk`): an entry is fetched, under
its entry lock and a reservation, into a part file ``tmp/<flat name>.<pid>.<token>.part``
(``O_EXCL``, 0600, never through a symlink), its size and xxh3-128 checked against the
manifest's (by the digest the fetch took as it wrote, else by reading it back), made
read-only, pinned, ``os.replace``d into ``data/`` and marked READY: one sequence,
:meth:`TierPublishing._publish_part`, which derived entries (:mod:`fastload.cache.derived`)
publish through too, with their checksum taken from the write. A failure is recorded as FAILED (with
a message naming a full device); a cancelled download returns the entry to ABSENT.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from fastload._fs import make_dirs, open_nofollow
from fastload.cache._entries import EntryKey, FetchFn, Pin, fd_checksum, open_dir
from fastload.cache._room import TierRoom
from fastload.cache.catalog import EntryState
from fastload.cache.locks import try_flock
from fastload.errors import CacheError, CacheFullError, FastloadError
from fastload.shards.checksum import Xxh3Hasher, check

_READ_ONLY = 0o400
_READ_ONLY_SHARED = 0o440


#: Checks a part file once written: ``verify(fd, written, part)`` gets its descriptor
#: (read-only), what the writer returned and its path; returns the content checksum the
#: catalog records, or raises.
VerifyFn = Callable[[int, object, Path], str]


class TierPublishing(TierRoom):
    """Fetch an entry into a part file, verify it and publish it atomically."""

    def _fetch_locked(
        self, key: EntryKey, size: int, fetch: FetchFn, path: Path, room_wait_s: float | None
    ) -> Pin:
        name = key.name
        entry = (name, key.dataset, key.shard, key.checksum, size)  # its catalog row
        evicted, freed = self._reserve(key, size, room_wait_s)
        self._count(misses=1, fetches=1, evictions=evicted, bytes_evicted=freed)

        def verify(fd: int, digest: object, part: Path) -> str:
            # against the manifest's checksum, the key's
            if (
                isinstance(digest, Xxh3Hasher)
                and digest.nbytes == size
                and (os.fstat(fd).st_size == size)
            ):
                # every byte of the file, hashed in order as the fetch wrote it
                got_size, got = size, digest.hexdigest_tagged()
                self._count(hashed_on_arrival=1)
            else:
                got_size, got = fd_checksum(fd)
            check(f"{key} fetched into {part}", size, key.checksum, got_size, got)
            return key.checksum

        try:
            pin = self._publish_part(key, size, fetch, path, verify, bytes_fetched=size)
        except BaseException as exc:
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

    def _publish_part(
        self,
        key: EntryKey,
        size: int,
        write: FetchFn,
        path: Path,
        verify: VerifyFn,
        **bumps: float,
    ) -> Pin:
        """The one publish sequence of the tier (shards and derived entries), for
        ``key``, reserved FETCHING for ``size`` bytes: ``write(f)`` fills a new part
        file (``O_EXCL``, 0600, fsynced with ``sync_publish``), ``verify`` checks it
        (:data:`VerifyFn`: it gives the checksum to record), it is made read-only,
        pinned (a shared flock, taken before the file is visible), ``os.replace``d to
        ``path`` (the directory fsynced with ``sync_publish``) and marked READY with
        that checksum, the lifetime counters ``bumps`` added in the same transaction:
        READY is last, so nothing is ever served that was not whole and checked.
        Returns the pin. On any failure or interrupt, re-raised, the pin is released
        and the part file and ``path`` are removed; ending the FETCHING row is the
        caller's (FAILED or ABSENT)."""
        tmp = self.tmp_dir / f"{key.flat}.{os.getpid()}.{secrets.token_hex(4)}.part"
        pin: Pin | None = None
        try:
            written = _write_temp(tmp, write, self.shared, sync=self.sync_publish)
            fd = open_nofollow(tmp, os.O_RDONLY, shared=self.shared)
            try:
                checksum = verify(fd, written, tmp)
                os.fchmod(fd, _READ_ONLY_SHARED if self.shared else _READ_ONLY)
                try_flock(fd, fcntl.LOCK_SH, self.root, tmp)  # our pin, before it is visible
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
                self.catalog.put(
                    conn,
                    key.name,
                    key.dataset,
                    key.shard,
                    checksum,
                    size,
                    EntryState.READY,
                    boot=boot,
                )
                self.catalog.bump(conn, **bumps)
        except BaseException:
            if pin is not None:
                pin.release()
            with suppress(OSError):
                tmp.unlink()
            with suppress(OSError):
                path.unlink()
            raise
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
