"""Entries and pins of the NVMe tier (:mod:`fastload.cache.disk`): what an entry is
(:class:`EntryKey`, its name under ``data/``, the shape every name fastload writes has),
a pin on one (:class:`Pin`: a shared ``flock`` on the open data file), what listing the
entries shows (:class:`EntryInfo`, :class:`BadEntry`), and :class:`TierState`, the state
one :class:`~fastload.cache.disk.DiskTier` object holds (its settings, catalog, locks,
this process's counters and pins) with the read-only queries over it.

The other rooms of the tier build on :class:`TierState`: :mod:`fastload.cache._room`
(reserve, evict, the cap), :mod:`fastload.cache._publish` (fetch and publish),
:mod:`fastload.cache._maintenance` (verify, clear, sweep).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import quote

from fastload._fs import UnsafePathError
from fastload.cache._external import is_external, pin_path
from fastload.cache.catalog import Catalog, EntryColumns, EntryState
from fastload.cache.locks import EntryLocks, remember_until_fork, try_flock, unlock_and_close
from fastload.errors import ConfigError
from fastload.shards.checksum import TAG, Xxh3Hasher

#: Writes the entry's bytes into the given file (opened ``"wb"``, at offset 0). It may
#: return an :class:`Xxh3Hasher` fed every byte it wrote, in order, as it wrote them:
#: then the file is not read again to be verified.
FetchFn = Callable[[BinaryIO], object]
VerifyPolicy = Literal["publish", "open"]

#: The shape of every entry name fastload writes: ``<16 hex>/<hex>-<quoted shard>``.
_NAME = re.compile(r"[0-9a-f]{16}/[0-9a-f]{1,128}-[A-Za-z0-9%._~-]{1,400}")
DATASET_DIR = re.compile(r"[0-9a-f]{16}")


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
    #: shards read without caching them (RAM only, the cap untouched) because pinned
    #: entries and downloads left no room under the cap within ``room_wait_s``
    uncached_reads: int = 0
    #: shards read without caching them because the process downloading them had
    #: stopped beating its heartbeat for ``lease_s`` (stopped or hung)
    lease_bypasses: int = 0
    bytes_used: int = 0
    entries: int = 0


@dataclass(frozen=True)
class EntryInfo(EntryColumns):
    """An entry as listed by :meth:`DiskTier.entries` (``pins`` is 1 when some process
    holds it pinned, else 0: a pin is a shared flock, which has no count)."""

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
        if fd >= 0:
            unlock_and_close(fd, self._pid)


class TierState:
    """What one :class:`~fastload.cache.disk.DiskTier` object holds (set by its
    ``__init__``), this process's counters and pins, and the queries that only read
    the catalog."""

    root: Path
    wait_deadline_s: float
    room_wait_s: float
    lease_s: float
    verify_policy: VerifyPolicy
    shared: bool
    #: this machine's boot id (None where it cannot be read); entries are published
    #: without fsync, tagged with it, unless ``sync_publish`` or it is None
    boot: str | None
    sync_publish: bool
    data_dir: Path
    tmp_dir: Path
    lock_dir: Path
    catalog: Catalog
    locks: EntryLocks
    _limit: int | None
    _stats: DiskTierStats
    _stats_lock: threading.Lock
    _pid: int
    _pins: dict[str, list[Pin]]
    _unflushed: int  # hits of this object not yet in the lifetime counters

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
        if is_external(name):
            path = pin_path(self.lock_dir, name)
        elif not valid_name(name):
            return False
        else:
            path = self.data_dir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return not try_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.root, path)
        finally:
            os.close(fd)

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


def valid_name(name: str) -> bool:
    """Whether ``name`` has the shape :attr:`EntryKey.name` gives (no ``..``, no
    absolute path, one directory level)."""
    return bool(_NAME.fullmatch(name)) and ".." not in name


def open_dir(path: Path) -> int:
    """Open a directory without following a symlink at ``path``."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(
                f"{path}: is not a directory of fastload's (a symlink?); it is not followed"
            ) from None
        raise


def fd_checksum(fd: int) -> tuple[int, str]:
    """``(size, tagged xxh3-128)`` of the open file ``fd``, read with ``pread``."""
    hasher = Xxh3Hasher()
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    pos = 0
    while n := os.preadv(fd, [buf], pos):
        hasher.update(view[:n])
        pos += n
    return hasher.nbytes, hasher.hexdigest_tagged()
