"""The NVMe tier: verified shard files in a local directory under a hard byte cap.

Layout of ``cache_dir``::

    catalog.sqlite (+ -wal, -shm)   metadata shared by every process (see catalog.py)
    data/<dataset hash>/<checksum hex>-<shard name>    published, verified, read-only
    tmp/<flat name>.<pid>.<token>.part                  downloads in progress
    locks/<flat name>.lock                              per-entry flock files

**Publish.** An entry is fetched into a temp file in ``tmp/`` (``O_EXCL``, 0600), its
size and xxh3-128 checked, made read-only, ``os.replace``d into ``data/`` (a new
``data/<dataset>/`` is fsynced into ``data/``), then marked READY.

**Durability without fsync on the read path.** A cache needs its entries to be whole
and right, not to survive a power cut: by default an entry is published without
fsyncing it, and its catalog row records the machine's boot id
(``/proc/sys/kernel/random/boot_id``). Within one boot the page cache serves exactly
what was verified (dirty pages are written back before they are dropped); after a
reboot, which is the only way unwritten pages can be lost, the first open of such an
entry re-hashes it (the read comes from the disk then) and either marks it durable or
drops and refetches it. ``sync_publish=True`` (or no readable boot id) fsyncs the file
and the directory before the entry becomes visible instead: fsyncing 32 MB shards cost
0.07–0.24 s of a 0.4–0.9 s cold epoch of 316 MB here.

The whole download runs under the entry's lock (:mod:`fastload.cache.locks`): one
process per node fetches a shard while the others wait in a blocking ``flock``
and wake the moment it is released. A real error is recorded as FAILED and raised to
every request that waited for it; a cancelled download (KeyboardInterrupt,
SystemExit, CancelledError) returns the entry to ABSENT, and a waiter fetches it.

**Liveness without PIDs.** A reader pins an entry by holding a shared ``flock`` on
its open data file (the descriptor it maps); eviction takes an exclusive ``flock`` on
the file without blocking and skips the entry when it cannot. A download is alive as
long as its entry lock is held. Both live in the kernel's open files, so they hold
across PID namespaces (pods sharing a ``hostPath``), end when the holder dies, and are
never confused by a recycled PID. Descriptors are closed in forked children.

**The cap** (``cache_limit``, stored in the catalog: every process uses the cap last
set) counts everything the tier keeps under ``cache_dir``: every READY entry and every
download in progress at its full size, rounded up to 4 KiB blocks; the catalog with
its WAL (reserved at its size limit) and shared-memory file; the directories. A fetch
reserves its bytes before it starts, evicting least-recently-used unpinned entries in
the same catalog transaction; when pinned entries and other downloads leave no room it
waits (up to ``room_wait_s``) and then raises :class:`CacheFullError`, which
:class:`~fastload.cache.ShardCache` turns into a read that caches nothing (the shard
in RAM only, counted as ``uncached_reads``) unless ``on_full="raise"``. So the tier never
holds more than the cap (see docs/concepts.md for what is outside it).

**A stopped downloader stalls nobody.** The process holding an entry lock beats a
heartbeat (the lock file's mtime, every second); a waiter that sees none for
``lease_s`` raises :class:`~fastload.cache.locks.LeaseExpired` and the facade reads
the shard uncached (``lease_bypasses``), leaving the holder's reservation, part file
and later publish alone (see :mod:`fastload.cache.locks`).

Every open and close is O(log n) in the number of entries (primary-key and index
lookups, running totals kept by triggers); start-up does no full scan. Maintenance
(:meth:`DiskTier.verify`, :meth:`DiskTier.leftovers`) scans everything and never
follows a symlink.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from fastload._fs import UnsafePathError, check_file, make_dirs
from fastload.cache._entries import (
    BadEntry,
    DiskTierStats,
    EntryInfo,
    EntryKey,
    FetchFn,
    Pin,
    VerifyPolicy,
    fd_checksum,
)
from fastload.cache._maintenance import TierMaintenance
from fastload.cache._publish import TierPublishing
from fastload.cache._room import GROWTH
from fastload.cache.catalog import Catalog, CatalogBusy, EntryRow, EntryState, blocks
from fastload.cache.locks import EntryLocks, flock_failure
from fastload.config import parse_size
from fastload.errors import CacheError, CacheFullError, ConfigError, FastloadError

__all__ = ["BadEntry", "DiskTier", "DiskTierStats", "EntryInfo", "EntryKey", "FetchFn", "Pin"]

# defined in the tier's private rooms, public here: they keep the module they have always
# been pickled, fingerprinted (fastload.cached) and documented under
for _public in (BadEntry, DiskTierStats, EntryInfo, EntryKey, Pin):
    _public.__module__ = __name__


class DiskTier(TierPublishing, TierMaintenance):
    """Verified shard files in ``cache_dir`` under a hard cap of ``cache_limit`` bytes,
    shared by every thread and process on the node (and by pods sharing the directory).

    ``cache_dir`` has ``~`` expanded; it and its subdirectories are created 0700 and
    files 0600 whatever the umask, and a directory or catalog owned by another user or
    writable by group or others is refused with :class:`UnsafePathError` (naming it
    and the fix) unless ``shared=True`` (one group that trusts itself: 2770/0660,
    group members may write). ``cache_limit`` is bytes or a size string (``"400GB"``)
    and is stored in the directory; None keeps the stored cap (none if never set).
    ``wait_deadline_s`` bounds how long a request waits for another's download of the
    same entry, ``room_wait_s`` how long a fetch waits for room under the cap (then
    :class:`CacheFullError`, which :class:`~fastload.cache.ShardCache` turns into an
    uncached read unless told otherwise). ``lease_s``: a download whose process has not
    beaten its heartbeat for that long (stopped, hung) is bypassed by the waiters
    (:class:`~fastload.cache.locks.LeaseExpired`; see :mod:`fastload.cache.locks`).
    ``verify="publish"`` checks size and checksum when an entry is published;
    ``"open"`` also re-hashes the file on every hit (a full read). ``sweep=False``
    skips the start-up clean-up (``fastload cache verify`` reports leftovers first).
    ``sync_publish=True`` fsyncs each entry before publishing it (see the module
    docstring for the default). Raises :class:`ConfigError` on bad settings,
    :class:`CacheError` if the directory or catalog cannot be used (read-only, or on a
    filesystem without ``flock``): at construction, never mid-epoch.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        cache_limit: int | str | None = None,
        wait_deadline_s: float = 600.0,
        verify: VerifyPolicy = "publish",
        *,
        shared: bool = False,
        room_wait_s: float = 60.0,
        sweep: bool = True,
        sync_publish: bool = False,
        lease_s: float = 10.0,
    ) -> None:
        if verify not in ("publish", "open"):
            raise ConfigError(f"DiskTier verify must be 'publish' or 'open', got {verify!r}")
        if wait_deadline_s <= 0:
            raise ConfigError(f"DiskTier wait_deadline_s must be positive, got {wait_deadline_s}")
        if room_wait_s < 0:
            raise ConfigError(f"DiskTier room_wait_s must not be negative, got {room_wait_s}")
        if lease_s <= 0:
            raise ConfigError(f"DiskTier lease_s must be positive, got {lease_s}")
        self.root = Path(os.path.expanduser(os.fspath(cache_dir)))
        requested = None if cache_limit is None else parse_size(cache_limit, "cache_limit")
        self.wait_deadline_s = float(wait_deadline_s)
        self.room_wait_s = float(room_wait_s)
        self.lease_s = float(lease_s)
        self.verify_policy = verify
        self.shared = shared
        self.boot = boot_id()
        self.sync_publish = bool(sync_publish) or self.boot is None
        self.data_dir = self.root / "data"
        self.tmp_dir = self.root / "tmp"
        self.lock_dir = self.root / "locks"
        try:
            make_dirs(self.root, shared=shared)
            for d in (self.data_dir, self.tmp_dir, self.lock_dir):
                make_dirs(d, top=self.root, shared=shared)
        except UnsafePathError:
            raise
        except OSError as exc:
            raise CacheError(f"cannot create the cache directory {self.root}: {exc}") from exc
        check_usable(self.root, self.lock_dir, shared=shared)
        self.catalog = Catalog(self.root / "catalog.sqlite", shared=shared)
        if requested is None:
            with self.catalog.read() as conn:  # no write: nothing to wait for
                self._limit = self.catalog.cap(conn)
        else:
            with self.catalog.txn() as conn:
                self.catalog.set_cap(conn, requested)
                self._limit = self.catalog.cap(conn)
        self.locks = EntryLocks(self.lock_dir, shared=shared)
        self._stats = DiskTierStats()
        self._stats_lock = threading.Lock()
        self._pid = os.getpid()
        self._pins = {}
        self._unflushed = 0
        if sweep:
            # best effort: a process stopped inside a catalog write does not stall the
            # construction past the lease (the next start-up sweeps)
            with suppress(CatalogBusy):
                self.sweep()

    def get(self, key: EntryKey, size: int, fetch: FetchFn, *, pin: bool = False) -> Path:
        """Return the local path of ``key``'s verified file, fetching it if absent.

        ``size`` is the expected byte count; ``fetch(f)`` writes the bytes into ``f``.
        With ``pin=True`` the entry is pinned atomically with finding it READY (release
        with :meth:`unpin`); unpinned, the path may be evicted at any time after return,
        so readers use :meth:`pinned` or :meth:`open_pinned`. Raises
        :class:`CacheFullError` (before any fetch) if ``size`` cannot fit under the
        cap, or if no room is made within ``room_wait_s``; :class:`CacheError` if the
        fetch fails (also to requests that waited for a failing fetch elsewhere) or the
        wait times out.
        """
        p = self.open_pinned(key, size, fetch)
        if pin:
            self._count()
            self._pins.setdefault(key.name, []).append(p)
        else:
            p.release()
        return p.path

    def open_pinned(
        self, key: EntryKey, size: int, fetch: FetchFn, *, room_wait_s: float | None = None
    ) -> Pin:
        """Like :meth:`get`, but return the open, pinned file (a :class:`Pin`): the entry
        cannot be evicted until :meth:`Pin.release`. ``room_wait_s`` replaces the tier's
        for this call. Raises as :meth:`get`, and
        :class:`~fastload.cache.locks.LeaseExpired` when another process downloads the
        entry and has not beaten its heartbeat for ``lease_s``,
        :class:`~fastload.cache.catalog.CatalogBusy` when a process holds the catalog's
        write lock that long (stopped inside a write transaction)."""
        cap = self._limit
        if cap is not None and blocks(size) + self.metadata_bytes(least=True) + GROWTH > cap:
            raise CacheFullError(
                f"{key} is {size} bytes, more than fits under the cache limit of {cap} "
                f"bytes of {self.root} (its metadata takes {self.metadata_bytes(least=True)}); "
                "raise cache_limit or run without a disk cache"
            )
        requested_at = time.time()
        path = self.path_for(key)
        hit = self._hit(key, size, path)
        if hit is not None:
            return hit
        deadline = time.monotonic() + self.wait_deadline_s
        with self.locks.hold(key.flat, deadline, str(key), self.lease_s) as waited_s:
            if waited_s:
                self._count(waits=1, wait_s=waited_s)
            hit = self._hit(key, size, path)
            if hit is not None:
                return hit
            with self.catalog.read() as conn:
                row = self.catalog.row(conn, key.name)
            if (
                row is not None
                and row.state is EntryState.FAILED
                and row.failed_at is not None
                and row.failed_at >= requested_at
            ):
                self._count(failures=1)
                raise CacheError(
                    f"fetching {key} into {self.root} failed in another request: {row.error}"
                )
            return self._fetch_locked(key, size, fetch, path, room_wait_s)

    def count_uncached(self, *, bypassed: bool) -> None:
        """Count one shard read without caching it (the cap was full, or a stalled
        download of it was bypassed: ``bypassed``), here and in the lifetime counters
        ``fastload cache stats`` shows."""
        name = "lease_bypasses" if bypassed else "uncached_reads"
        self._count(**{name: 1})
        # best effort: the device may be full (the reason the shard is not cached)
        with suppress(FastloadError, sqlite3.Error), self._txn(self.lease_s) as conn:
            self.catalog.bump(conn, **{name: 1})

    @contextmanager
    def pinned(self, key: EntryKey, size: int, fetch: FetchFn) -> Iterator[Path]:
        """``with tier.pinned(key, size, fetch) as path:`` the entry cannot be evicted
        inside the block (by any process). Raises as :meth:`get`."""
        p = self.open_pinned(key, size, fetch)
        try:
            yield p.path
        finally:
            p.release()
            self.trim_to_cap()

    def unpin(self, key: EntryKey) -> None:
        """Release one pin of ``key`` taken by ``get(..., pin=True)`` in this process."""
        self._count()
        pins = self._pins.get(key.name)
        if pins:
            pins.pop().release()
            if not pins:
                del self._pins[key.name]
        self.trim_to_cap()

    def _open_published(self, path: Path, size: int) -> int | None:
        """Open and pin (shared flock) the published file at ``path`` if it is whole and
        still the published one; None if absent or being evicted."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(
                    f"{path}: is a symlink; fastload does not follow symlinks in its cache"
                ) from None
            raise CacheError(f"cannot open the cached file {path}: {exc}") from exc
        try:
            for attempt in range(20):
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # an evictor or verifier holds it for a moment
                    if attempt == 19:
                        os.close(fd)
                        return None
                    time.sleep(0.001 * (attempt + 1))
                except OSError as exc:
                    detail = f"{path}: {exc.strerror or exc}"
                    raise flock_failure(self.root, exc.errno or 0, detail) from exc
            st = check_file(fd, path, shared=self.shared)
            if st.st_nlink == 0 or st.st_size != size:
                os.close(fd)  # evicted (unlinked) under us, or not the published size
                return None
        except BaseException:
            with suppress(OSError):
                os.close(fd)
            raise
        return fd

    def _hit(self, key: EntryKey, size: int, path: Path) -> Pin | None:
        """If ``key`` is READY and whole, pin it, mark it used and return the pin."""
        fd = self._open_published(path, size)
        if fd is None:
            return None
        pin = Pin(fd, path, size)
        try:
            # pinned first: no eviction can run between this check and the caller's use
            with self.catalog.read() as conn:
                row = self.catalog.row(conn, key.name)
                if row is None or row.state is not EntryState.READY or row.size != size:
                    pin.release()
                    return None
                # LRU order needs a write only when the entry is not among the more
                # recently used half: hot entries are opened with no write at all
                meta = self.catalog.meta(conn)
                clock, count = int(meta.get("clock") or 0), int(meta.get("ready_count") or 0)
                stale = row.last_use <= clock - max(count // 2, 1)
            # published unsynced in an earlier boot: what reached the disk is checked
            # once, then the entry counts as durable
            unsynced = row.boot is not None and row.boot != self.boot
            if unsynced:
                self._count(reboot_checks=1)
            if (self.verify_policy == "open" or unsynced) and not self._rehash_ok(pin, row):
                return None
            # bookkeeping only: skipped when a writer stopped inside its transaction
            # holds the catalog past the lease (a hit never stalls on it)
            if unsynced:
                with suppress(CatalogBusy), self._txn(self.lease_s) as conn:
                    self.catalog.mark_durable(conn, key.name, row.checksum)
            self._pending_hits(1)
            if stale:
                with suppress(CatalogBusy), self._txn(self.lease_s) as conn:
                    self.catalog.touch(conn, key.name)
                    self._flush(conn)
        except BaseException:
            pin.release()
            raise
        self._count(hits=1)
        return pin

    def _rehash_ok(self, pin: Pin, row: EntryRow) -> bool:
        """``verify="open"``: re-hash the pinned file; a damaged one is dropped (under
        the entry lock, and only if it is still the file that was hashed)."""
        got_size, got = fd_checksum(pin.fd)
        if got_size == row.size and got == row.checksum:
            return True
        ino = os.fstat(pin.fd).st_ino
        pin.release()
        with self.locks.try_hold(row.name.replace("/", "-", 1)) as free:
            if free:
                with self._txn() as conn:
                    cur = self.catalog.row(conn, row.name)
                    try:
                        same = os.lstat(self.data_dir / row.name).st_ino == ino
                    except FileNotFoundError:
                        same = False
                    if cur is not None and cur.checksum == row.checksum and same:
                        self._evict(conn, row.name, force=True)
                        self.catalog.bump(conn, corrupt=1)
        return False

    def close(self) -> None:
        """Release this process's pins taken with ``get(pin=True)`` and close this
        thread's catalog connection."""
        self._count()
        for pins in self._pins.values():
            for p in pins:
                p.release()
        self._pins = {}
        if self._unflushed:
            with suppress(FastloadError), self._txn(self.lease_s) as conn:
                self._flush(conn)
        self.catalog.close()


def check_usable(root: Path, lock_dir: Path, *, shared: bool) -> None:
    """Refuse, with a :class:`CacheError` naming the directory and the fix, a cache
    directory that cannot be written (read-only mount, no permission) or whose
    filesystem does not support ``flock`` (some network filesystems): found here, at
    construction, rather than by the first fetch in the middle of an epoch."""
    probe = lock_dir / f".probe.{os.getpid()}.{threading.get_ident()}"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise CacheError(
                f"the cache directory {root} cannot be written ({exc.strerror}): fastload "
                "keeps its cache there; pass a writable cache_dir, or none to cache in RAM"
            ) from exc
        raise CacheError(f"cannot use the cache directory {root}: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            detail = f"{probe}: {exc.strerror or exc}"
            raise flock_failure(root, exc.errno or 0, detail) from exc
    finally:
        os.close(fd)
        with suppress(OSError):
            os.unlink(probe)


_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This machine's boot id (the same in every container on it), or None where it
    cannot be read."""
    try:
        text = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    return text or None
