"""The NVMe tier: verified shard files in a local directory under a byte cap.

Layout of ``cache_dir``::

    catalog.sqlite            metadata shared by every process (see catalog.py)
    data/<dataset hash>/<checksum hex>-<shard name>    published, verified entries
    tmp/<flat name>.<pid>.<token>.part                  downloads in progress
    locks/<flat name>.lock                              per-entry flock files

An entry is published as: fetch into a temp file in ``tmp/`` (same filesystem), check
size and xxh3-128, fsync, ``os.replace`` into ``data/``, fsync the directory, then mark
it READY in the catalog. The whole download runs under the entry's lock
(:mod:`fastload.cache.locks`), so one process per node fetches a shard while the others
wait with a deadline; a failure is recorded as FAILED with its message and raised to
every request that was waiting for it. Start-up sweeps temp files and stale rows whose
entry lock nobody holds (a live peer's download holds it).

Eviction is LRU over unpinned entries (:func:`fastload.cache.policy.choose_victims`),
done inside the same catalog transaction that reserves room for a new entry; a victim
file is unlinked before that transaction commits, so a file that exists for a deleted
row never outlives the commit. Readers pin entries (:meth:`DiskTier.pinned`); pins of
dead processes are ignored.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import quote

from fastload._fs import open_nofollow
from fastload.cache.catalog import Catalog, EntryRow, EntryState
from fastload.cache.locks import EntryLocks
from fastload.cache.policy import choose_victims
from fastload.config import parse_size
from fastload.errors import CacheError, CacheFullError, ConfigError, FastloadError
from fastload.shards.checksum import TAG, check, file_checksum

__all__ = ["BadEntry", "DiskTier", "DiskTierStats", "EntryInfo", "EntryKey", "FetchFn"]

#: Writes the entry's bytes into the given file (opened ``"wb"``, at offset 0).
FetchFn = Callable[[BinaryIO], None]
VerifyPolicy = Literal["publish", "open"]


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
    bytes_used: int = 0
    entries: int = 0


@dataclass(frozen=True)
class EntryInfo:
    """An entry as listed by :meth:`DiskTier.entries`."""

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


class DiskTier:
    """Verified shard files in ``cache_dir`` under ``cache_limit`` bytes, shared by every
    thread and process on the node.

    ``cache_limit`` is bytes or a size string (``"400GB"``); None means no cap.
    ``wait_deadline_s`` bounds how long a request waits for another's download of the
    same entry. ``verify="publish"`` checks size and checksum when an entry is
    published; ``"open"`` also re-hashes the file on every hit (a full read).
    Raises :class:`ConfigError` on bad settings, :class:`CacheError` if the directory
    or catalog cannot be used.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        cache_limit: int | str | None = None,
        wait_deadline_s: float = 600.0,
        verify: VerifyPolicy = "publish",
    ) -> None:
        if verify not in ("publish", "open"):
            raise ConfigError(f"DiskTier verify must be 'publish' or 'open', got {verify!r}")
        if wait_deadline_s <= 0:
            raise ConfigError(f"DiskTier wait_deadline_s must be positive, got {wait_deadline_s}")
        self.root = Path(cache_dir)
        self.limit = None if cache_limit is None else parse_size(cache_limit, "cache_limit")
        self.wait_deadline_s = float(wait_deadline_s)
        self.verify_policy: VerifyPolicy = verify
        self.shared = False
        self.data_dir = self.root / "data"
        self.tmp_dir = self.root / "tmp"
        try:
            for d in (self.data_dir, self.tmp_dir, self.root / "locks"):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache directory {self.root}: {exc}") from exc
        self.catalog = Catalog(self.root / "catalog.sqlite")
        self.locks = EntryLocks(self.root / "locks")
        self._stats = DiskTierStats()
        self._stats_lock = threading.Lock()
        self._pid = os.getpid()
        self.sweep()

    # ------------------------------------------------------------------ paths
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
        with self._stats_lock:
            for k, v in deltas.items():
                setattr(self._stats, k, getattr(self._stats, k) + v)

    # -------------------------------------------------------------------- get
    def get(self, key: EntryKey, size: int, fetch: FetchFn, *, pin: bool = False) -> Path:
        """Return the local path of ``key``'s verified file, fetching it if absent.

        ``size`` is the expected byte count; ``fetch(f)`` writes the bytes into ``f``.
        With ``pin=True`` the entry is pinned atomically with finding it READY (release
        with :meth:`unpin`); unpinned, the path may be evicted at any time after return,
        so readers use :meth:`pinned`. Raises :class:`CacheFullError` (before any fetch)
        if ``size`` exceeds the cap, :class:`CacheError` if the fetch fails (also to
        requests that waited for a failing fetch elsewhere) or the wait times out.
        """
        if self.limit is not None and size > self.limit:
            raise CacheFullError(
                f"{key} is {size} bytes, more than the cache limit of {self.limit} bytes "
                f"of {self.root}; raise cache_limit or run without a disk cache"
            )
        requested_at = time.time()
        path = self.path_for(key)
        if self._hit(key, size, path, pin):
            return path
        deadline = time.monotonic() + self.wait_deadline_s
        with self.locks.hold(key.flat, deadline, str(key)) as waited_s:
            if waited_s:
                self._count(waits=1, wait_s=waited_s)
            if self._hit(key, size, path, pin):
                return path
            with self.catalog.txn() as conn:
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
            self._fetch_locked(key, size, fetch, path, pin)
            return path

    @contextmanager
    def pinned(self, key: EntryKey, size: int, fetch: FetchFn) -> Iterator[Path]:
        """``with tier.pinned(key, size, fetch) as path:`` the entry cannot be evicted
        inside the block (by any process). Raises as :meth:`get`."""
        path = self.get(key, size, fetch, pin=True)
        try:
            yield path
        finally:
            self.unpin(key)

    def unpin(self, key: EntryKey) -> None:
        """Release one pin of ``key`` taken by ``get(..., pin=True)`` in this process."""
        with self.catalog.txn() as conn:
            self.catalog.remove_pin(conn, key.name)
            # the cap may only be exceeded by pinned bytes: trim what the pin allowed
            evicted, freed = self._make_room(conn, 0)
        self._count(evictions=evicted, bytes_evicted=freed)

    def _make_room(self, conn: sqlite3.Connection, need: int, exclude: str = "") -> tuple[int, int]:
        """Evict LRU unpinned entries so ``need`` more bytes fit under the cap (inside
        the caller's transaction); returns ``(entries evicted, bytes freed)``."""
        if self.limit is None:
            return 0, 0
        occupants = self.catalog.occupants(conn, exclude)
        victims, _short = choose_victims(occupants, need, self.limit)
        sizes = {c.name: c.size for c in occupants}
        for victim in victims:
            self._drop(conn, victim)
        freed = sum(sizes[v] for v in victims)
        self.catalog.bump(conn, evictions=len(victims), bytes_evicted=freed)
        return len(victims), freed

    def _usable(self, row: EntryRow | None, size: int, path: Path, deep: bool) -> bool:
        if row is None or row.state is not EntryState.READY or row.size != size:
            return False
        try:
            if path.stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
        if deep:
            got_size, got = file_checksum(path)
            return got_size == size and got == row.checksum
        return True

    def _hit(self, key: EntryKey, size: int, path: Path, pin: bool) -> bool:
        """If ``key`` is READY and whole, mark it used (and pin it) and return True."""
        if self.verify_policy == "open":
            return self._hit_verified(key, size, path, pin)
        with self.catalog.txn() as conn:
            # checked inside the transaction that touches and pins: an eviction either
            # ran before (the row is gone) or cannot run until the pin is in place
            row = self.catalog.row(conn, key.name)
            if not self._usable(row, size, path, deep=False):
                return False
            self.catalog.touch(conn, key.name)
            if pin:
                self.catalog.add_pin(conn, key.name)
            self.catalog.bump(conn, hits=1)
        self._count(hits=1)
        return True

    def _hit_verified(self, key: EntryKey, size: int, path: Path, pin: bool) -> bool:
        with self.catalog.txn() as conn:
            row = self.catalog.row(conn, key.name)
            if not self._usable(row, size, path, deep=False):
                return False
            # pinned while hashing so the file cannot be evicted under us
            self.catalog.add_pin(conn, key.name)
        ok = self._usable(row, size, path, deep=True)
        with self.catalog.txn() as conn:
            if not pin or not ok:
                self.catalog.remove_pin(conn, key.name)
            if ok:
                self.catalog.touch(conn, key.name)
                self.catalog.bump(conn, hits=1)
            else:
                self._drop(conn, key.name)
                self.catalog.bump(conn, corrupt=1)
        if ok:
            self._count(hits=1)
        return ok

    def _drop(self, conn: sqlite3.Connection, name: str) -> None:
        """Unlink ``name``'s file and delete its row (inside the caller's transaction)."""
        with suppress(FileNotFoundError):
            (self.data_dir / name).unlink()
        Catalog.delete(conn, name)

    def _fetch_locked(
        self, key: EntryKey, size: int, fetch: FetchFn, path: Path, pin: bool
    ) -> None:
        name = key.name
        with self.catalog.txn() as conn:
            evicted, freed = self._make_room(conn, size, exclude=name)
            self.catalog.put(
                conn, name, key.dataset, key.shard, key.checksum, size, EntryState.FETCHING
            )
            self.catalog.bump(conn, misses=1, fetches=1)
        self._count(misses=1, fetches=1, evictions=evicted, bytes_evicted=freed)
        tmp = self.tmp_dir / f"{key.flat}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            _write_temp(tmp, fetch, self.shared)
            got_size, got = file_checksum(tmp)
            check(f"{key} fetched into {tmp}", size, key.checksum, got_size, got)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            with self.catalog.txn() as conn:
                self.catalog.put(
                    conn, name, key.dataset, key.shard, key.checksum, size, EntryState.READY
                )
                if pin:
                    self.catalog.add_pin(conn, name)
                self.catalog.bump(conn, bytes_fetched=size)
        except BaseException as exc:
            with suppress(OSError):
                tmp.unlink()
            with suppress(OSError):
                path.unlink()
            if not isinstance(exc, Exception):
                # cancelled (KeyboardInterrupt, SystemExit, CancelledError): this caller
                # gave up, the entry did not fail; back to ABSENT, so that waiters fetch
                # it themselves instead of receiving an error
                with suppress(FastloadError), self.catalog.txn() as conn:
                    conn.execute(
                        "DELETE FROM entries WHERE name=? AND state=?",
                        (name, int(EntryState.FETCHING)),
                    )
                raise
            message = self._describe_failure(key, exc)
            with suppress(FastloadError), self.catalog.txn() as conn:
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
        with self.catalog.txn() as conn:
            row = self.catalog.row(conn, key.name)
        return row is not None and row.state is EntryState.READY

    def bytes_used(self) -> int:
        """Bytes of READY entries plus room reserved by downloads in progress."""
        with self.catalog.txn() as conn:
            return sum(c.size for c in self.catalog.occupants(conn))

    def headroom(self) -> int:
        """Bytes that can still be added without evicting anything (a large number
        when there is no cap)."""
        if self.limit is None:
            return 2**62
        return max(self.limit - self.bytes_used(), 0)

    def evictable_headroom(self) -> int:
        """Bytes that can be added by evicting unpinned entries if needed."""
        if self.limit is None:
            return 2**62
        with self.catalog.txn() as conn:
            pinned = sum(c.size for c in self.catalog.occupants(conn) if c.pinned)
        return max(self.limit - pinned, 0)

    def counters(self) -> DiskTierStats:
        """This object's counters in this process, without touching the catalog (cheap:
        ``bytes_used`` and ``entries`` are left 0; :meth:`stats` fills them)."""
        self._count()
        with self._stats_lock:
            return DiskTierStats(
                **{f.name: getattr(self._stats, f.name) for f in fields(DiskTierStats)}
            )

    def stats(self) -> DiskTierStats:
        """This object's counters with the tier's current ``bytes_used`` and ``entries``."""
        with self.catalog.txn() as conn:
            ready = self.catalog.rows(conn, EntryState.READY)
        out = self.counters()
        out.bytes_used = sum(r.size for r in ready)
        out.entries = len(ready)
        return out

    def lifetime_counters(self) -> dict[str, float]:
        """Counters summed over every process that ever used this directory."""
        with self.catalog.txn() as conn:
            return self.catalog.counters(conn)

    def entries(self) -> list[EntryInfo]:
        """Every entry in the catalog (any state), least recently used first."""
        with self.catalog.txn() as conn:
            pins = self.catalog.live_pins(conn)
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
                pins.get(r.name, 0),
                r.error,
            )
            for r in rows
        ]

    # ----------------------------------------------------------- maintenance
    def verify(self, repair: bool = False) -> list[BadEntry]:
        """Re-hash every READY entry; return the damaged ones (missing file, wrong size
        or checksum). With ``repair=True`` they are dropped, so the next get re-fetches."""
        bad: list[BadEntry] = []
        with self.catalog.txn() as conn:
            rows = self.catalog.rows(conn, EntryState.READY)
        deadline = time.monotonic() + self.wait_deadline_s
        for row in rows:
            path = self.data_dir / row.name
            with self.locks.hold(row.name.replace("/", "-", 1), deadline, row.name):
                try:
                    got_size, got = file_checksum(path)
                except FileNotFoundError:
                    reason = f"file {path} is missing"
                else:
                    if got_size != row.size:
                        reason = f"file {path} is {got_size} bytes, expected {row.size}"
                    elif got != row.checksum:
                        reason = f"file {path} has checksum {got}, expected {row.checksum}"
                    else:
                        continue
                bad.append(BadEntry(row.name, row.dataset, row.shard, reason))
                if repair:
                    with self.catalog.txn() as conn:
                        current = self.catalog.row(conn, row.name)
                        if current is not None and current.state is EntryState.READY:
                            self._drop(conn, row.name)
                            self.catalog.bump(conn, corrupt=1)
        return bad

    def clear(self) -> tuple[int, int]:
        """Remove every unpinned READY entry and every FAILED record; downloads in
        progress and pinned entries stay. Returns ``(entries removed, bytes freed)``."""
        removed = freed = 0
        with self.catalog.txn() as conn:
            pins = self.catalog.live_pins(conn)
            for row in self.catalog.rows(conn):
                if row.state is EntryState.FAILED or (
                    row.state is EntryState.READY and not pins.get(row.name)
                ):
                    self._drop(conn, row.name)
                    if row.state is EntryState.READY:
                        removed += 1
                        freed += row.size
        return removed, freed

    def sweep(self) -> dict[str, int]:
        """Clean up after crashed processes: temp files and FETCHING rows whose entry
        lock nobody holds, READY rows whose file is gone or the wrong size, data files
        with no READY row, and bytes over the cap that only dead pins held. Returns
        counts of what was removed."""
        report = {"temp_files": 0, "stale_rows": 0, "orphan_files": 0, "evicted": 0}
        for tmp in list(self.tmp_dir.glob("*.part")):
            flat = tmp.name.rsplit(".", 3)[0]
            with self.locks.try_hold(flat) as free:
                if free:
                    with suppress(FileNotFoundError):
                        tmp.unlink()
                        report["temp_files"] += 1
        with self.catalog.txn() as conn:
            rows = self.catalog.rows(conn)
        known = set()
        for row in rows:
            known.add(row.name)
            if row.state is EntryState.FAILED:
                continue
            path = self.data_dir / row.name
            if row.state is EntryState.READY and self._usable(row, row.size, path, False):
                continue  # the common case needs neither the lock nor a transaction
            with self.locks.try_hold(row.name.replace("/", "-", 1)) as free:
                if not free:
                    continue
                with self.catalog.txn() as conn:
                    cur = self.catalog.row(conn, row.name)
                    if cur is None or cur.state is EntryState.FAILED:
                        continue
                    if cur.state is EntryState.READY and self._usable(cur, cur.size, path, False):
                        continue
                    self._drop(conn, row.name)
                    report["stale_rows"] += 1
        for path in list(self.data_dir.glob("*/*")):
            name = f"{path.parent.name}/{path.name}"
            if name in known:
                continue
            with self.locks.try_hold(name.replace("/", "-", 1)) as free:
                if not free:
                    continue
                with self.catalog.txn() as conn:
                    cur = self.catalog.row(conn, name)
                    if cur is None or cur.state is not EntryState.READY:
                        with suppress(FileNotFoundError):
                            path.unlink()
                            report["orphan_files"] += 1
        # pins of processes that died no longer excuse bytes over the cap
        with self.catalog.txn() as conn:
            report["evicted"] = self._make_room(conn, 0)[0]
        return report

    def close(self) -> None:
        """Close this thread's catalog connection."""
        self.catalog.close()


#: Descriptors of temp files whose download was cancelled, now pointing at /dev/null.
_PARKED: list[int] = []


def _write_temp(tmp: Path, fetch: FetchFn, shared: bool) -> None:
    """Create ``tmp`` (``O_EXCL``, never through a symlink, 0600) and let ``fetch`` write
    it; fsync it.

    When ``fetch`` is cancelled (KeyboardInterrupt, SystemExit, CancelledError) its
    writers may not all have stopped: a thread it started can still hold the number of
    this descriptor. Closing it would let the next ``open()`` of the process reuse the
    number and receive the download's bytes, so the number is parked instead: pointed
    at ``/dev/null`` with ``dup2`` and kept open for the life of the process (one
    descriptor per cancelled download)."""
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, shared=shared)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            fetch(f)
        os.fsync(fd)
    except BaseException as exc:
        if isinstance(exc, Exception):
            os.close(fd)
        else:
            _park(fd)
        raise
    os.close(fd)


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
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
