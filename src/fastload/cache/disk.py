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
waits (up to ``room_wait_s``) and then raises :class:`CacheFullError`. So the tier never
holds more than the cap (see docs/concepts.md for what is outside it).

Every open and close is O(log n) in the number of entries (primary-key and index
lookups, running totals kept by triggers); start-up does no full scan. Maintenance
(:meth:`DiskTier.verify`, :meth:`DiskTier.leftovers`) scans everything and never
follows a symlink.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import quote

from fastload._fs import UnsafePathError, check_file, make_dirs, open_nofollow
from fastload.cache.catalog import BLOCK, WAL_LIMIT, Catalog, EntryRow, EntryState, blocks
from fastload.cache.locks import EntryLocks, forget_in_child, remember_until_fork
from fastload.config import parse_size
from fastload.errors import CacheError, CacheFullError, ConfigError, FastloadError
from fastload.shards.checksum import TAG, Xxh3Hasher, check

__all__ = ["BadEntry", "DiskTier", "DiskTierStats", "EntryInfo", "EntryKey", "FetchFn", "Pin"]

#: Writes the entry's bytes into the given file (opened ``"wb"``, at offset 0). It may
#: return an :class:`Xxh3Hasher` fed every byte it wrote, in order, as it wrote them:
#: then the file is not read again to be verified.
FetchFn = Callable[[BinaryIO], object]
VerifyPolicy = Literal["publish", "open"]

#: The shape of every entry name fastload writes: ``<16 hex>/<hex>-<quoted shard>``.
_NAME = re.compile(r"[0-9a-f]{16}/[0-9a-f]{1,128}-[A-Za-z0-9%._~-]{1,400}")
_DATASET_DIR = re.compile(r"[0-9a-f]{16}")
#: What the catalog may grow by between two measurements (one transaction's new pages).
_GROWTH = 16 * 1024
#: What one write transaction of the tier may add to the WAL, paid for by evicting when
#: a reader keeps the WAL at its reserve (measured: up to 36 KiB for a reservation or
#: a publish with evictions, 20 KiB for an LRU touch)
_WAL_TXN = 64 * 1024
_READ_ONLY = 0o400
_READ_ONLY_SHARED = 0o440


@dataclass(frozen=True)
class EntryKey:
    """Content address of a cache entry: the dataset (its URL), the shard name and the
    checksum the manifest gives for it. A changed remote object has a new checksum and
    so a new key: it is never served from a stale entry."""

    dataset: str
    shard: str
    checksum: str

    def __post_init__(self) -> None:
        tag, _, digest = self.checksum.partition(":")
        if tag != TAG or not digest or not all(c in "0123456789abcdef" for c in digest):
            raise ConfigError(
                f"cache key for {self.shard!r} of {self.dataset!r}: checksum must look like "
                f"'{TAG}:<hex>', got {self.checksum!r}"
            )

    @property
    def name(self) -> str:
        """Path of the entry relative to ``data/``: ``<dataset hash>/<hex>-<shard>``."""
        ds = hashlib.sha256(self.dataset.encode()).hexdigest()[:16]
        return f"{ds}/{self.checksum.partition(':')[2]}-{quote(self.shard, safe='')}"

    @property
    def flat(self) -> str:
        """The name with no directory part (for temp and lock files)."""
        return self.name.replace("/", "-", 1)

    def __str__(self) -> str:
        return f"shard {self.shard!r} of {self.dataset} ({self.checksum})"


@dataclass
class DiskTierStats:
    """Counters of one :class:`DiskTier` object (this process), plus the tier's current
    occupancy as every process sees it."""

    hits: int = 0
    misses: int = 0
    fetches: int = 0
    bytes_fetched: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    waits: int = 0
    wait_s: float = 0.0
    failures: int = 0
    #: entries published unsynced in an earlier boot, re-hashed on their first open
    reboot_checks: int = 0
    #: fetched entries verified by the checksum of their bytes as they arrived (the
    #: rest were read back from the file to be hashed)
    hashed_on_arrival: int = 0
    bytes_used: int = 0
    entries: int = 0


@dataclass(frozen=True)
class EntryInfo:
    """An entry as listed by :meth:`DiskTier.entries` (``pins`` is 1 when some process
    holds it pinned, else 0: a pin is a shared flock, which has no count)."""

    name: str
    dataset: str
    shard: str
    checksum: str
    size: int
    state: EntryState
    last_use: int
    touched: float
    pins: int
    error: str | None


@dataclass(frozen=True)
class BadEntry:
    """An entry :meth:`DiskTier.verify` found damaged, and why."""

    name: str
    dataset: str
    shard: str
    reason: str


class Pin:
    """A pinned, open, published entry file: ``fd`` (read-only, holding a shared flock
    that keeps the entry from being evicted) and ``path``. :meth:`release` unlocks and
    closes it (in the process that pinned it only; a forked child's copy was closed at
    the fork)."""

    __slots__ = ("_pid", "fd", "path", "size")

    def __init__(self, fd: int, path: Path, size: int) -> None:
        self.fd = fd
        self.path = path
        self.size = size
        self._pid = os.getpid()
        remember_until_fork(fd)

    @property
    def released(self) -> bool:
        """Whether :meth:`release` ran (or the pin was inherited across a fork)."""
        return self.fd < 0 or self._pid != os.getpid()

    def __del__(self) -> None:
        # a pin dropped unreleased (its CachedShard or ShardSource collected): its
        # descriptor and shared flock would otherwise stay for the process's life
        with suppress(Exception):
            self.release()

    def release(self) -> None:
        """Unpin: ``LOCK_UN`` and close (idempotent)."""
        fd, self.fd = self.fd, -1
        if fd < 0 or self._pid != os.getpid():
            return
        forget_in_child(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class DiskTier:
    """Verified shard files in ``cache_dir`` under a hard cap of ``cache_limit`` bytes,
    shared by every thread and process on the node (and by pods sharing the directory).

    ``cache_dir`` has ``~`` expanded; it and its subdirectories are created 0700 and
    files 0600 whatever the umask, and a directory or catalog owned by another user or
    writable by group or others is refused with :class:`UnsafePathError` (naming it
    and the fix) unless ``shared=True`` (one group that trusts itself: 2770/0660,
    group members may write). ``cache_limit`` is bytes or a size string (``"400GB"``)
    and is stored in the directory; None keeps the stored cap (none if never set).
    ``wait_deadline_s`` bounds how long a request waits for another's download of the
    same entry, ``room_wait_s`` how long a fetch waits for room under the cap.
    ``verify="publish"`` checks size and checksum when an entry is published;
    ``"open"`` also re-hashes the file on every hit (a full read). ``sweep=False``
    skips the start-up clean-up (``fastload cache verify`` reports leftovers first).
    ``sync_publish=True`` fsyncs each entry before publishing it (see the module
    docstring for the default). Raises :class:`ConfigError` on bad settings,
    :class:`CacheError` if the directory or catalog cannot be used.
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
    ) -> None:
        if verify not in ("publish", "open"):
            raise ConfigError(f"DiskTier verify must be 'publish' or 'open', got {verify!r}")
        if wait_deadline_s <= 0:
            raise ConfigError(f"DiskTier wait_deadline_s must be positive, got {wait_deadline_s}")
        if room_wait_s < 0:
            raise ConfigError(f"DiskTier room_wait_s must not be negative, got {room_wait_s}")
        self.root = Path(os.path.expanduser(os.fspath(cache_dir)))
        requested = None if cache_limit is None else parse_size(cache_limit, "cache_limit")
        self.wait_deadline_s = float(wait_deadline_s)
        self.room_wait_s = float(room_wait_s)
        self.verify_policy: VerifyPolicy = verify
        self.shared = shared
        #: this machine's boot id (None where it cannot be read); entries are published
        #: without fsync, tagged with it, unless ``sync_publish`` or it is None
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
        self.catalog = Catalog(self.root / "catalog.sqlite", shared=shared)
        with self.catalog.txn() as conn:
            if requested is not None:
                self.catalog.set_cap(conn, requested)
            self._limit = self.catalog.cap(conn)
        self.locks = EntryLocks(self.lock_dir, shared=shared)
        self._stats = DiskTierStats()
        self._stats_lock = threading.Lock()
        self._pid = os.getpid()
        self._pins: dict[str, list[Pin]] = {}
        self._unflushed = 0  # hits of this object not yet in the lifetime counters
        if sweep:
            self.sweep()

    # ------------------------------------------------------------------ paths
    @property
    def limit(self) -> int | None:
        """The byte cap as last read from the catalog (None: no cap)."""
        return self._limit

    def path_for(self, key: EntryKey) -> Path:
        """Where ``key``'s file lives once published."""
        return self.data_dir / key.name

    def _count(self, **deltas: float) -> None:
        if self._pid != os.getpid():
            # a lock held by a parent's thread at fork time would never be released here
            self._pid, self._stats_lock, self._stats = (
                os.getpid(),
                threading.Lock(),
                DiskTierStats(),
            )
            self._pins = {}
            self._unflushed = 0
        with self._stats_lock:
            for k, v in deltas.items():
                setattr(self._stats, k, getattr(self._stats, k) + v)

    # -------------------------------------------------------------------- get
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

    def open_pinned(self, key: EntryKey, size: int, fetch: FetchFn) -> Pin:
        """Like :meth:`get`, but return the open, pinned file (a :class:`Pin`): the entry
        cannot be evicted until :meth:`Pin.release`. Raises as :meth:`get`."""
        cap = self._limit
        if cap is not None and blocks(size) + self.metadata_bytes(least=True) + _GROWTH > cap:
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
        with self.locks.hold(key.flat, deadline, str(key)) as waited_s:
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
            return self._fetch_locked(key, size, fetch, path)

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

    def _wal_due(self) -> int:
        """What the next write transaction must have room for beyond its reserve:
        ``_WAL_TXN`` when the WAL is within that of :data:`WAL_LIMIT` and a shrink
        (tried first) left it there because a reader holds it; else 0."""
        if self._limit is None or self.catalog.wal_bytes() + _WAL_TXN <= WAL_LIMIT:
            return 0
        self.catalog.shrink_wal(0.5)
        return _WAL_TXN if self.catalog.wal_bytes() + _WAL_TXN > WAL_LIMIT else 0

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        """A catalog write transaction that keeps the cap while a reader holds the WAL
        at its reserve (:meth:`_wal_due`): what the write may add to the WAL is paid for
        by evicting LRU unpinned entries inside the transaction."""
        due = self._wal_due()
        evicted = freed = 0
        with self.catalog.txn() as conn:
            if due:
                evicted, freed, _ = self._make_room(conn, due)
            yield conn
        if evicted:
            self._count(evictions=evicted, bytes_evicted=freed)

    def trim_to_cap(self) -> None:
        """After a pin is released: evict down to the cap if pins had held it above (the
        cap was lowered meanwhile). One O(1) read when under the cap."""
        cap = self._limit
        if cap is None:
            return
        with self.catalog.read() as conn:
            # the WAL at its reserve: its growth is shrunk, never paid for with entries
            over = self.catalog.used(conn) + self.metadata_bytes(least=True) > cap
        if over:
            with self._txn() as conn:
                evicted, freed, _ = self._make_room(conn, 0, wal_first=True)
            self._count(evictions=evicted, bytes_evicted=freed)

    # ------------------------------------------------------------------- hits
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
            if unsynced:
                with self._txn() as conn:
                    self.catalog.mark_durable(conn, key.name, row.checksum)
            self._pending_hits(1)
            if stale:
                with self._txn() as conn:
                    self.catalog.touch(conn, key.name)
                    self._flush(conn)
        except BaseException:
            pin.release()
            raise
        self._count(hits=1)
        return pin

    def _pending_hits(self, n: int) -> None:
        self._count()
        with self._stats_lock:
            self._unflushed += n

    def _flush(self, conn: sqlite3.Connection) -> None:
        """Add the hits not yet written to the lifetime counters (inside a write
        transaction this tier runs anyway: a hit alone writes nothing)."""
        with self._stats_lock:
            n, self._unflushed = self._unflushed, 0
        self.catalog.bump(conn, hits=n)

    def _rehash_ok(self, pin: Pin, row: EntryRow) -> bool:
        """``verify="open"``: re-hash the pinned file; a damaged one is dropped (under
        the entry lock, and only if it is still the file that was hashed)."""
        got_size, got = _fd_checksum(pin.fd)
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

    # ------------------------------------------------------------------ fetch
    def _fetch_locked(self, key: EntryKey, size: int, fetch: FetchFn, path: Path) -> Pin:
        name = key.name
        evicted, freed = self._reserve(key, size)
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
                    got_size, got = _fd_checksum(fd)
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
                self.catalog.put(
                    conn,
                    name,
                    key.dataset,
                    key.shard,
                    key.checksum,
                    size,
                    EntryState.READY,
                    boot=None if self.sync_publish else self.boot,
                )
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
                self.catalog.put(
                    conn,
                    name,
                    key.dataset,
                    key.shard,
                    key.checksum,
                    size,
                    EntryState.FAILED,
                    error=message,
                )
                self.catalog.bump(conn, failures=1)
            self._count(failures=1)
            raise CacheError(message) from exc
        self._count(bytes_fetched=size)
        return pin

    def _publish_dir(self, directory: Path) -> None:
        """Create ``data/<dataset>/`` if needed (0700, checked, fsynced into ``data/``)."""
        if os.path.lexists(directory):
            return
        make_dirs(directory, top=self.root, shared=self.shared)
        _fsync_dir(self.data_dir)

    def _reserve(self, key: EntryKey, size: int) -> tuple[int, int]:
        """Mark ``key`` FETCHING, with room for ``size`` bytes under the cap (evicting
        LRU unpinned entries; waiting up to ``room_wait_s`` for pins and downloads to
        free some). Returns ``(entries evicted, bytes freed)``. Raises
        :class:`CacheFullError` when no room came."""
        deadline = time.monotonic() + self.room_wait_s
        evicted = freed = 0
        delay = 0.005
        while True:
            # the cap counts the WAL: one near its reserve is shrunk first
            due = self._wal_due()
            with self.catalog.txn() as conn:
                self._limit = self.catalog.cap(conn)
                # a first entry of its dataset also creates data/<dataset>/
                dir_cost = 0 if os.path.lexists(self.path_for(key).parent) else BLOCK
                n, b, fits = self._make_room(conn, blocks(size) + dir_cost + due, exclude=key.name)
                evicted, freed = evicted + n, freed + b
                if fits:
                    self.catalog.put(
                        conn,
                        key.name,
                        key.dataset,
                        key.shard,
                        key.checksum,
                        size,
                        EntryState.FETCHING,
                    )
                    self.catalog.bump(conn, misses=1, fetches=1)
                    self._flush(conn)
                    return evicted, freed
                used = self.catalog.used(conn)
            if time.monotonic() + delay > deadline:
                self._count(evictions=evicted, bytes_evicted=freed)
                held = (
                    f" (its WAL has grown to {self.catalog.wal_bytes()} bytes, near or past "
                    f"its {WAL_LIMIT} reserve: some process keeps a catalog read transaction "
                    "open)"
                    if due
                    else ""
                )
                raise CacheFullError(
                    f"no room for {key} ({size} bytes) in {self.root} under its cache limit "
                    f"of {self._limit} bytes: {used} bytes are pinned by readers or reserved "
                    f"by downloads in progress (plus {self.metadata_bytes()} of metadata{held}) "
                    f"after waiting {self.room_wait_s:.0f} s; raise cache_limit or open fewer "
                    "shards at once"
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.2)

    def _make_room(
        self, conn: sqlite3.Connection, need: int, exclude: str = "", wal_first: bool = False
    ) -> tuple[int, int, bool]:
        """Evict LRU unpinned entries (and reclaim downloads of dead processes) so that
        ``need`` more bytes fit under the cap, inside the caller's transaction. Returns
        ``(entries evicted, bytes freed, whether it fits now)``."""
        cap = self._limit
        if cap is None:
            return 0, 0, True
        # room for the catalog to grow by what the coming writes add, so that the
        # metadata measured after them is still under the cap
        over = self.catalog.used(conn) + self.metadata_bytes() + _GROWTH + need - cap
        if over <= 0:
            return 0, 0, True
        if wal_first and self.catalog.wal_bytes() > WAL_LIMIT:
            # the WAL outgrew its reserve (readers kept it from resetting): shrinking it
            # (outside this transaction) frees room without evicting anything
            return 0, 0, False
        for name in self.catalog.names_in(conn, EntryState.FETCHING):
            if name != exclude and _valid_name(name):
                over -= self._reclaim(conn, name)
        evicted = freed = 0
        after: tuple[int, str] | None = None
        while over > 0:
            page = self.catalog.lru_page(conn, after)
            if not page:
                break
            for name, size, last_use in page:
                after = (last_use, name)
                if name == exclude:
                    continue
                got = self._evict(conn, name)
                if got is not None:
                    evicted += 1
                    freed += size
                    over -= blocks(size)
                    if over <= 0:
                        break
        self.catalog.bump(conn, evictions=evicted, bytes_evicted=freed)
        return evicted, freed, over <= 0

    def _reclaim(self, conn: sqlite3.Connection, name: str) -> int:
        """Drop the FETCHING row ``name`` and its leftovers if its downloader is gone
        (nobody holds the entry lock); returns the blocks freed."""
        flat = name.replace("/", "-", 1)
        with self.locks.try_hold(flat) as free:
            if not free:
                return 0
            row = self.catalog.row(conn, name)
            if row is None or row.state is not EntryState.FETCHING:
                return 0
            self._remove_temp_files(flat)
            with suppress(FileNotFoundError):
                self._unlink_data(name)  # published, then killed before READY
            self.catalog.delete(conn, name, EntryState.FETCHING)
            return blocks(row.size)

    def _remove_temp_files(self, flat: str) -> int:
        removed = 0
        with os.scandir(self.tmp_dir) as it:
            for e in it:
                if e.name.startswith(flat + ".") and e.name.endswith(".part"):
                    with suppress(FileNotFoundError):
                        os.unlink(self.tmp_dir / e.name)
                        removed += 1
        return removed

    def _evict(self, conn: sqlite3.Connection, name: str, force: bool = False) -> bool | None:
        """Unlink entry ``name``'s file and delete its row (inside the caller's
        transaction) unless a reader has it pinned; returns None when pinned. A row
        whose name is not of the shape fastload writes is deleted without touching any
        file (``force`` also drops a pinned entry: only for a corrupt file)."""
        if not _valid_name(name):
            Catalog.delete(conn, name)
            return True
        ds, _, base = name.partition("/")
        try:
            dfd = _open_dir(self.data_dir / ds)
        except FileNotFoundError:
            Catalog.delete(conn, name)
            return True
        try:
            try:
                fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                Catalog.delete(conn, name)
                return True
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                os.unlink(base, dir_fd=dfd)  # a planted symlink: removed, never followed
                Catalog.delete(conn, name)
                return True
            try:
                if not force:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        return None
                Catalog.delete(conn, name)
                # the file goes only once the row's deletion is committed: a SIGKILL in
                # between leaves a file without a row (swept as an orphan, replaced by
                # the next fetch's rename), never a READY row without its file; the
                # exclusive lock is held until then, so no reader pins it meanwhile
                ino = os.fstat(fd).st_ino
                keep_dfd = os.dup(dfd)
                self.catalog.defer(
                    lambda: _unlink_same(keep_dfd, base, ino, fd),
                    lambda: _close_both(fd, keep_dfd),
                )
                return True
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(dfd)

    def _unlink_data(self, name: str) -> None:
        ds, _, base = name.partition("/")
        dfd = _open_dir(self.data_dir / ds)
        try:
            os.unlink(base, dir_fd=dfd)
        finally:
            os.close(dfd)

    def metadata_bytes(self, least: bool = False) -> int:
        """Bytes of metadata the cap counts: the catalog (its WAL at least at its size
        limit; exactly that with ``least``, the floor after a checkpoint), the lock
        files and the directories."""
        total = 0
        base = os.fspath(self.root / "catalog.sqlite")
        total += self.catalog.db_bytes()
        with suppress(FileNotFoundError):
            total += os.stat(base + "-shm").st_blocks * 512
        total += WAL_LIMIT if least else max(self.catalog.wal_bytes(), WAL_LIMIT)
        for d in (self.root, self.data_dir, self.tmp_dir, self.lock_dir):
            with suppress(FileNotFoundError):
                total += os.lstat(d).st_blocks * 512
        with suppress(FileNotFoundError), os.scandir(self.data_dir) as it:
            for e in it:
                with suppress(FileNotFoundError):
                    total += e.stat(follow_symlinks=False).st_blocks * 512
        return total

    def _describe_failure(self, key: EntryKey, exc: BaseException) -> str:
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
                return (
                    f"no space left on the cache device while fetching {key} ({key.shard}) into "
                    f"{self.root}: free space there or lower cache_limit"
                )
            cause = cause.__cause__ or cause.__context__
        return f"fetching {key} into {self.root} failed: {type(exc).__name__}: {exc}"

    # ---------------------------------------------------------------- queries
    def contains(self, key: EntryKey) -> bool:
        """Whether ``key`` is READY now (it may be evicted right after)."""
        with self.catalog.read() as conn:
            row = self.catalog.row(conn, key.name)
        return row is not None and row.state is EntryState.READY

    def ready_among(self, keys: Iterable[EntryKey]) -> set[EntryKey]:
        """Those of ``keys`` that are READY now (one read transaction; any may be
        evicted right after)."""
        out: set[EntryKey] = set()
        with self.catalog.read() as conn:
            for key in keys:
                row = self.catalog.row(conn, key.name)
                if row is not None and row.state is EntryState.READY:
                    out.add(key)
        return out

    def bytes_used(self) -> int:
        """Bytes the cap counts now: READY entries and downloads in progress (whole
        blocks) plus the metadata."""
        with self.catalog.read() as conn:
            return self.catalog.used(conn) + self.metadata_bytes()

    def headroom(self) -> int:
        """Bytes that can still be added without evicting anything (a large number
        when there is no cap)."""
        if self._limit is None:
            return 2**62
        return max(self._limit - self.bytes_used(), 0)

    def evictable_headroom(self) -> int:
        """Bytes that can be added by evicting entries nobody in *this process* has
        pinned (pins of other processes are found only when evicting; a fetch that
        then does not fit waits for room)."""
        if self._limit is None:
            return 2**62
        self._count()
        mine = sum(blocks(p.size) for ps in self._pins.values() for p in ps)
        with self.catalog.read() as conn:
            fetching = int(self.catalog.meta(conn).get("fetching_bytes") or 0)
        return max(self._limit - mine - fetching - self.metadata_bytes(), 0)

    def counters(self) -> DiskTierStats:
        """This object's counters in this process, without touching the catalog (cheap:
        ``bytes_used`` and ``entries`` are left 0; :meth:`stats` fills them)."""
        self._count()
        with self._stats_lock:
            return DiskTierStats(
                **{f.name: getattr(self._stats, f.name) for f in fields(DiskTierStats)}
            )

    def stats(self) -> DiskTierStats:
        """This object's counters with the tier's current ``bytes_used`` (bytes of READY
        entries) and ``entries`` (their count), read in O(1)."""
        with self.catalog.read() as conn:
            meta = self.catalog.meta(conn)
        out = self.counters()
        out.bytes_used = int(meta.get("ready_bytes") or 0)
        out.entries = int(meta.get("ready_count") or 0)
        return out

    def usage(self) -> dict[str, int | None]:
        """What the cap counts, in bytes: ``cap``, ``data`` (READY entries and downloads
        in progress, whole blocks), ``metadata``, ``total``; plus ``ready_bytes`` and
        ``fetching_bytes`` (exact sizes)."""
        with self.catalog.read() as conn:
            meta = self.catalog.meta(conn)
        overhead = self.metadata_bytes()
        data = int(meta.get("used") or 0)
        return {
            "cap": meta.get("cap"),
            "data": data,
            "metadata": overhead,
            "total": data + overhead,
            "ready_bytes": int(meta.get("ready_bytes") or 0),
            "fetching_bytes": int(meta.get("fetching_bytes") or 0),
        }

    def set_limit(self, cache_limit: int | str | None) -> None:
        """Store a new cap for every process (None: no cap) and trim down to it (pinned
        entries go when their pins are released)."""
        cap = None if cache_limit is None else parse_size(cache_limit, "cache_limit")
        with self._txn() as conn:
            self.catalog.set_cap(conn, cap)
            self._limit = cap
            evicted, freed, _ = self._make_room(conn, 0, wal_first=True)
        self._count(evictions=evicted, bytes_evicted=freed)

    def lifetime_counters(self) -> dict[str, float]:
        """Counters summed over every process that used this directory (hits of other
        live processes reach them with their next write or :meth:`close`)."""
        with self.catalog.read() as conn:
            out = self.catalog.counters(conn)
        self._count()
        with self._stats_lock:
            if self._unflushed:
                out["hits"] = out.get("hits", 0.0) + self._unflushed
        return out

    def _pinned_elsewhere(self, name: str) -> bool:
        """Whether some process holds ``name`` pinned (probe: a non-blocking exclusive
        flock on its file, released at once)."""
        if not _valid_name(name):
            return False
        try:
            fd = os.open(self.data_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def entries(self) -> list[EntryInfo]:
        """Every entry in the catalog (any state), least recently used first."""
        with self.catalog.read() as conn:
            rows = self.catalog.rows(conn)
        return [
            EntryInfo(
                r.name,
                r.dataset,
                r.shard,
                r.checksum,
                r.size,
                r.state,
                r.last_use,
                r.touched,
                int(r.state is EntryState.READY and self._pinned_elsewhere(r.name)),
                r.error,
            )
            for r in rows
        ]

    # ----------------------------------------------------------- maintenance
    def verify(self, repair: bool = False) -> list[BadEntry]:
        """Re-hash every READY entry; return the damaged ones (missing file, wrong size
        or checksum, not a regular file, a name fastload never writes). With
        ``repair=True`` they are dropped, so the next get re-fetches."""
        bad: list[BadEntry] = []
        with self.catalog.read() as conn:
            rows = self.catalog.rows(conn, EntryState.READY)
        deadline = time.monotonic() + self.wait_deadline_s
        for row in rows:
            reason = self._check_entry(row)
            if reason is None:
                continue
            bad.append(BadEntry(row.name, row.dataset, row.shard, reason))
            if repair:
                with (
                    self.locks.hold(row.name.replace("/", "-", 1), deadline, row.name),
                    self._txn() as conn,
                ):
                    current = self.catalog.row(conn, row.name)
                    if current is not None and current.state is EntryState.READY:
                        self._evict(conn, row.name, force=True)
                        self.catalog.bump(conn, corrupt=1)
        return bad

    def _check_entry(self, row: EntryRow) -> str | None:
        if not _valid_name(row.name):
            return f"catalog name {row.name!r} is not one fastload writes"
        path = self.data_dir / row.name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return f"file {path} is missing"
        except OSError as exc:
            return f"file {path} cannot be opened: {exc}"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"{path} is not a regular file"
            got_size, got = _fd_checksum(fd)
        finally:
            os.close(fd)
        if got_size != row.size:
            return f"file {path} is {got_size} bytes, expected {row.size}"
        if got != row.checksum:
            return f"file {path} has checksum {got}, expected {row.checksum}"
        return None

    def clear(self) -> tuple[int, int]:
        """Remove every unpinned READY entry and every FAILED record; downloads in
        progress and pinned entries stay. Returns ``(entries removed, bytes freed)``."""
        removed = freed = 0
        with self._txn() as conn:
            for row in self.catalog.rows(conn):
                if row.state is EntryState.FAILED:
                    self.catalog.delete(conn, row.name)
                elif row.state is EntryState.READY and self._evict(conn, row.name):
                    removed += 1
                    freed += row.size
        return removed, freed

    def leftovers(self) -> dict[str, list[str]]:
        """What crashed or killed processes left, without removing anything: temp files
        and FETCHING rows whose lock nobody holds (``temp_files``, ``stale_rows``),
        data files with no READY row (``orphan_files``), and anything that is not a
        regular file or directory of fastload's shape under ``data/`` and ``tmp/``
        (``unexpected``: symlinks, planted names). Never follows a symlink."""
        out: dict[str, list[str]] = {
            "temp_files": [],
            "stale_rows": [],
            "orphan_files": [],
            "unexpected": [],
        }
        with os.scandir(self.tmp_dir) as it:
            for e in it:
                if not e.is_file(follow_symlinks=False) or not e.name.endswith(".part"):
                    out["unexpected"].append(f"tmp/{e.name}")
                    continue
                with self.locks.try_hold(e.name.rsplit(".", 3)[0]) as free:
                    if free:
                        out["temp_files"].append(f"tmp/{e.name}")
        with self.catalog.read() as conn:
            fetching = self.catalog.names_in(conn, EntryState.FETCHING)
            ready = set(self.catalog.names_in(conn, EntryState.READY))
        for name in fetching:
            with self.locks.try_hold(name.replace("/", "-", 1)) as free:
                if free:
                    out["stale_rows"].append(name)
        busy = set(fetching)
        with os.scandir(self.data_dir) as it:
            for d in it:
                if not d.is_dir(follow_symlinks=False) or not _DATASET_DIR.fullmatch(d.name):
                    out["unexpected"].append(f"data/{d.name}")
                    continue
                with os.scandir(self.data_dir / d.name) as files:
                    for f in files:
                        name = f"{d.name}/{f.name}"
                        if not f.is_file(follow_symlinks=False) or not _valid_name(name):
                            out["unexpected"].append(f"data/{name}")
                        elif name not in ready and name not in busy:
                            out["orphan_files"].append(f"data/{name}")
        return out

    def sweep(self, full: bool = False) -> dict[str, int]:
        """Clean up after crashed processes: temp files and FETCHING rows whose entry
        lock nobody holds, and bytes over the cap. With ``full`` (``fastload cache
        verify --repair``) also data files with no READY row, READY rows whose file
        is gone, and anything unexpected under ``data/`` and ``tmp/`` (a symlink is
        removed, never followed). Start-up runs the cheap part: it reads only ``tmp/``
        and the FETCHING rows. Returns counts of what was removed."""
        report = {"temp_files": 0, "stale_rows": 0, "orphan_files": 0, "evicted": 0}
        with os.scandir(self.tmp_dir) as it:
            temps = [e.name for e in it]
        for tname in temps:
            flat = tname.rsplit(".", 3)[0]
            ok = tname.endswith(".part")
            with self.locks.try_hold(flat) if ok else _yes() as free:
                if free and (ok or full):
                    with suppress(FileNotFoundError):
                        os.unlink(self.tmp_dir / tname)
                        report["temp_files"] += 1
        with self.catalog.read() as conn:
            fetching = self.catalog.names_in(conn, EntryState.FETCHING)
        for name in fetching:
            with self._txn() as conn:
                if not _valid_name(name):
                    self.catalog.delete(conn, name, EntryState.FETCHING)
                    report["stale_rows"] += 1
                elif self._reclaim(conn, name):
                    report["stale_rows"] += 1
                elif self.catalog.row(conn, name) is None:
                    report["stale_rows"] += 1  # an empty reservation (size 0)
        if full:
            found = self.leftovers()
            for rel in found["orphan_files"] + found["unexpected"]:
                if not rel.startswith("data/"):
                    continue
                name = rel[len("data/") :]
                with self.locks.try_hold(name.replace("/", "-", 1)) as free:
                    if not free:
                        continue
                    with self._txn() as conn:
                        cur = self.catalog.row(conn, name)
                        if cur is not None and cur.state is not EntryState.FAILED:
                            continue
                        with suppress(OSError):
                            target = self.data_dir / name
                            if os.path.isdir(target) and not os.path.islink(target):
                                os.rmdir(target)
                            else:
                                os.unlink(target)
                            report["orphan_files"] += 1
            with self.catalog.read() as conn:
                rows = self.catalog.rows(conn, EntryState.READY)
            for row in rows:
                if self._check_entry(row) is not None:
                    try:
                        size = os.lstat(self.data_dir / row.name).st_size
                    except (FileNotFoundError, ValueError):
                        size = -1
                    if size != row.size:
                        with self._txn() as conn:
                            self._evict(conn, row.name, force=True)
                            report["stale_rows"] += 1
        if self.catalog.wal_bytes() > WAL_LIMIT:
            self.catalog.shrink_wal()  # left by processes that died with it grown
        with self._txn() as conn:
            self._limit = self.catalog.cap(conn)
            report["evicted"] = self._make_room(conn, 0, wal_first=True)[0]
        return report

    def close(self) -> None:
        """Release this process's pins taken with ``get(pin=True)`` and close this
        thread's catalog connection."""
        self._count()
        for pins in self._pins.values():
            for p in pins:
                p.release()
        self._pins = {}
        if self._unflushed:
            with suppress(FastloadError), self._txn() as conn:
                self._flush(conn)
        self.catalog.close()


@contextmanager
def _yes() -> Iterator[bool]:
    yield True


def _valid_name(name: str) -> bool:
    """Whether ``name`` has the shape :attr:`EntryKey.name` gives (no ``..``, no
    absolute path, one directory level)."""
    return bool(_NAME.fullmatch(name)) and ".." not in name


def _open_dir(path: Path) -> int:
    """Open a directory without following a symlink at ``path``."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(
                f"{path}: is not a directory of fastload's (a symlink?); it is not followed"
            ) from None
        raise


_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This machine's boot id (the same in every container on it), or None where it
    cannot be read."""
    try:
        text = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    return text or None


def _fd_checksum(fd: int) -> tuple[int, str]:
    """``(size, tagged xxh3-128)`` of the open file ``fd``, read with ``pread``."""
    hasher = Xxh3Hasher()
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    pos = 0
    while n := os.preadv(fd, [buf], pos):
        hasher.update(view[:n])
        pos += n
    return hasher.nbytes, hasher.hexdigest_tagged()


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
    fd = _open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_same(dfd: int, base: str, ino: int, fd: int) -> None:
    """Unlink ``base`` in directory ``dfd`` if it is still the inode ``ino`` (a later
    fetch may have renamed a new file into its place), then close both descriptors
    (the last drops the eviction's exclusive lock)."""
    try:
        with suppress(FileNotFoundError):
            if os.stat(base, dir_fd=dfd, follow_symlinks=False).st_ino == ino:
                os.unlink(base, dir_fd=dfd)
    finally:
        os.close(fd)
        os.close(dfd)


def _close_both(fd: int, dfd: int) -> None:
    os.close(fd)
    os.close(dfd)
