"""The disk tier's metadata: one sqlite database (WAL mode) shared by every process.

It records, per entry, the state (:class:`EntryState`), size, checksum and a logical
last-use clock, plus running totals kept by triggers (bytes and blocks of READY and
FETCHING entries: the cap's data side, read in O(1)), the stored byte cap, and
lifetime counters for ``fastload cache stats``. Nothing here names a process: pins
and downloads are judged alive by ``flock`` (see :mod:`fastload.cache.disk`), which
works across PID namespaces.

Every query an open or a close runs is a primary-key lookup, an update of one row or
an index range scan (``entries(state, last_use, name)``): O(log n) in the number of
entries. Connections are opened lazily per process and thread and re-opened after a
fork (DataLoader workers fork), so nothing inherited across ``fork`` is reused. The
WAL is checkpointed every 32 pages, truncated when it resets and shrunk by a writer that
finds it past half of :data:`WAL_LIMIT`, so the metadata stays small and bounded
(the cap counts it).
"""

from __future__ import annotations

import contextlib
import enum
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload._fs import UnsafePathError, open_nofollow
from fastload._fs import _owner_problem as owner_problem
from fastload.cache._busy import (
    BUSY_SLICE_S,
    begin_immediate,
    checkpoint_truncate,
    connect_wal,
    execute,
    set_busy_timeout,
)
from fastload.cache._catalog_errors import catalog_error, rollback
from fastload.errors import CacheError, CatalogBusy

__all__ = [
    "BLOCK",
    "BUSY_SLICE_S",
    "WAL_LIMIT",
    "Catalog",
    "CatalogBusy",
    "EntryColumns",
    "EntryRow",
    "EntryState",
    "blocks",
    "connect_wal",
    "execute",
    "set_busy_timeout",
]

#: Allocation unit the cap counts entries in (a file of n bytes takes whole blocks).
BLOCK = 4096
#: The write-ahead log is checkpointed every 32 pages and truncated to 128 KiB when it
#: resets; under many concurrent readers it can grow past that until a writer shrinks
#: it (see :meth:`Catalog.txn`). The cap reserves this much for it (or its real size,
#: when larger).
WAL_LIMIT = 512 * 1024
_WAL_TRUNCATE = 128 * 1024
_SCHEMA_VERSION = 2

_COLUMNS = "name, dataset, shard, checksum, size, state, last_use, touched, error, failed_at, boot"


def _delta(row: str, sign: str) -> list[str]:
    """SQL updating the running totals for ``row`` (NEW or OLD) entering (+) or
    leaving (-)."""
    ready = f"(CASE WHEN {row}.state = 3 THEN 1 ELSE 0 END)"
    busy = f"(CASE WHEN {row}.state IN (2, 3) THEN 1 ELSE 0 END)"
    fetching = f"(CASE WHEN {row}.state = 2 THEN 1 ELSE 0 END)"
    size_blocks = f"((({row}.size + {BLOCK - 1}) / {BLOCK}) * {BLOCK})"
    return [
        f"UPDATE meta SET value = value {sign} {busy} * {size_blocks} WHERE key = 'used';",
        f"UPDATE meta SET value = value {sign} {ready} * {row}.size WHERE key = 'ready_bytes';",
        f"UPDATE meta SET value = value {sign} {ready} WHERE key = 'ready_count';",
        f"UPDATE meta SET value = value {sign} {fetching} * {row}.size "
        "WHERE key = 'fetching_bytes';",
    ]


_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS entries(
        name TEXT PRIMARY KEY,
        dataset TEXT NOT NULL,
        shard TEXT NOT NULL,
        checksum TEXT NOT NULL,
        size INTEGER NOT NULL,
        state INTEGER NOT NULL,
        last_use INTEGER NOT NULL,
        touched REAL NOT NULL,
        error TEXT,
        failed_at REAL,
        boot TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS entries_lru ON entries(state, last_use, name)",
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER)",
    "INSERT OR IGNORE INTO meta VALUES ('used', 0), ('ready_bytes', 0), ('ready_count', 0), "
    "('fetching_bytes', 0), ('clock', 0), ('cap', NULL)",
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value REAL NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS entries_ins AFTER INSERT ON entries BEGIN "
    + " ".join(_delta("NEW", "+"))
    + " END",
    "CREATE TRIGGER IF NOT EXISTS entries_del AFTER DELETE ON entries BEGIN "
    + " ".join(_delta("OLD", "-"))
    + " END",
    "CREATE TRIGGER IF NOT EXISTS entries_upd AFTER UPDATE OF state, size ON entries BEGIN "
    + " ".join(_delta("OLD", "-") + _delta("NEW", "+"))
    + " END",
]


class _ForkGuard:
    """Keeps ``fork()`` out of the middle of a catalog operation of another thread.

    sqlite keeps its lock bookkeeping per process and per file (shared by every
    connection of the process to that file). A child forked while another thread of
    the parent holds a lock (a write transaction, a checkpoint, a connection being
    opened) inherits that bookkeeping with nobody left to release it: its own new
    connection is then refused the write lock until ``busy_timeout`` ("database is
    locked" after 60 s in a DataLoader worker). Operations hold the guard; the fork
    waits (up to 10 s) for those in flight and starts none until it is done."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = 0
        self._mine = threading.local()

    @contextmanager
    def hold(self) -> Iterator[None]:
        depth = getattr(self._mine, "depth", 0)
        if depth == 0:
            with self._cond:
                self._busy += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            if depth == 0:
                with self._cond:
                    self._busy -= 1
                    if not self._busy:
                        self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()  # held across fork(): no operation starts meanwhile
        own = 1 if getattr(self._mine, "depth", 0) else 0
        self._cond.wait_for(lambda: self._busy <= own, timeout=10.0)

    def after_fork_in_parent(self) -> None:
        self._cond.release()

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's other threads do not exist here


_FORK_GUARD = _ForkGuard()
os.register_at_fork(
    before=_FORK_GUARD.before_fork,
    after_in_parent=_FORK_GUARD.after_fork_in_parent,
    after_in_child=_FORK_GUARD.after_fork_in_child,
)

# Connections inherited across fork must be neither used nor closed by the child
# (closing could checkpoint or unlink the parent's WAL); keep them referenced forever.
_INHERITED: list[sqlite3.Connection] = []


class EntryState(enum.IntEnum):
    """State of a cache entry. Zero is deliberately not a state, so an unset value is
    never mistaken for one."""

    ABSENT = 1
    FETCHING = 2
    READY = 3
    FAILED = 4


@dataclass(frozen=True)
class EntryColumns:
    """What an entry is described by, first: the columns :class:`EntryRow` (a row of
    the ``entries`` table) and :class:`~fastload.cache.disk.EntryInfo` (an entry as
    listed) share, in their order."""

    name: str
    dataset: str
    shard: str
    checksum: str
    size: int
    state: EntryState
    last_use: int
    touched: float


@dataclass(frozen=True)
class EntryRow(EntryColumns):
    """One row of the ``entries`` table."""

    error: str | None
    failed_at: float | None
    #: The boot id of the machine that published the entry without fsyncing it; None
    #: once it is known to be on disk (fsynced, or re-hashed after a reboot).
    boot: str | None = None


def blocks(size: int) -> int:
    """``size`` rounded up to whole :data:`BLOCK` s (what a file of ``size`` bytes takes)."""
    return -(-size // BLOCK) * BLOCK


class Catalog:
    """Access to the cache's sqlite database at ``path``.

    Every write goes through :meth:`txn` (``BEGIN IMMEDIATE`` … ``COMMIT``), so a
    read-check-write such as "make room, then reserve" is atomic across processes.
    The file is created 0600 (0660 with ``shared``) and refused when it is a symlink
    or not trusted (:func:`fastload._fs.check_file`). A catalog of an older layout is
    reset (its entries are then orphans, removed by ``fastload cache verify --repair``).
    Raises :class:`CacheError` when the database cannot be opened or stays locked past
    ``busy_timeout_s``.
    """

    def __init__(
        self, path: str | os.PathLike[str], busy_timeout_s: float = 60.0, *, shared: bool = False
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.shared = shared
        self._local = threading.local()
        # until when (monotonic) a shrink of the WAL is not retried: one failed for its
        # whole timeout, so a reader holds the WAL; trying at every write would stall
        # each by the timeout
        self._stuck_until = 0.0
        self._check_file()
        if self._current():
            return  # nothing to write: a writer stopped mid-transaction does not stall us
        with self.txn() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version != _SCHEMA_VERSION:
                for old in ("entries", "pins", "meta"):
                    conn.execute(f"DROP TABLE IF EXISTS {old}")
                conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            for statement in _SCHEMA:
                conn.execute(statement)
            columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(entries)")}
            if "boot" not in columns:
                # added in place (a catalog written before it keeps its entries; an
                # older fastload reading this one selects its columns by name)
                conn.execute("ALTER TABLE entries ADD COLUMN boot TEXT")

    def _current(self) -> bool:
        """Whether the database already has this layout (read without the write lock)."""
        with self.read() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version != _SCHEMA_VERSION:
                return False
            columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(entries)")}
            triggers = {
                str(r[0])
                for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
            }
            meta = conn.execute("SELECT count(*) FROM sqlite_master WHERE name='meta'")
            return (
                "boot" in columns
                and {"entries_ins", "entries_del", "entries_upd"} <= triggers
                and int(meta.fetchone()[0]) == 1
            )

    def _check_file(self) -> None:
        """Create the catalog file 0600 (``O_EXCL``, no symlink followed), or check the
        existing one with ``lstat``: never by opening and closing it, since closing any
        descriptor of a database drops every POSIX lock sqlite holds on it in this
        process."""
        try:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, shared=self.shared)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CacheError(f"cannot create the cache catalog {self.path}: {exc}") from exc
        else:
            os.close(fd)  # ours alone: no connection of this process can have it open yet
            return
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise CacheError(f"cannot open the cache catalog {self.path}: {exc}") from exc
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{self.path}: is a symlink; fastload does not follow symlinks in its cache"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{self.path}: is not a regular file")
        problem = owner_problem(st, self.shared)
        if problem is not None:
            raise UnsafePathError(
                f"{self.path}: {problem}; remove it, or `chown` it to yourself and "
                f"`chmod {'660' if self.shared else '600'} {self.path}`"
            )

    # -------------------------------------------------------------- connections
    def _conn(self) -> sqlite3.Connection:
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == pid:
            return conn
        if conn is not None:
            _INHERITED.append(conn)
        try:
            conn = connect_wal(self.path, self.busy_timeout_s)
            conn.execute("PRAGMA wal_autocheckpoint=32")
            conn.execute(f"PRAGMA journal_size_limit={_WAL_TRUNCATE}")
        except sqlite3.Error as exc:
            raise CacheError(f"cannot open the cache catalog {self.path}: {exc}") from exc
        self._local.conn = conn
        self._local.pid = pid
        return conn

    def defer(self, on_commit: Any, on_rollback: Any) -> None:
        """Run ``on_commit()`` right after the current write transaction of this thread
        commits, ``on_rollback()`` if it rolls back (file work that must follow the
        catalog: an eviction unlinks its file only once the row is gone for good)."""
        self._local.deferred.append((on_commit, on_rollback))

    def _run_deferred(self, committed: bool) -> None:
        pending, self._local.deferred = getattr(self._local, "deferred", []), []
        for on_commit, on_rollback in pending:
            with contextlib.suppress(OSError):
                (on_commit if committed else on_rollback)()

    @contextmanager
    def txn(self, timeout_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction; rolled back if the block raises. ``timeout_s`` (default
        ``busy_timeout_s``) bounds the wait for the write lock: past it,
        :class:`CatalogBusy`."""
        with _FORK_GUARD.hold():
            conn = self._conn()
            _abandon(conn)
            self._local.deferred = []
            wait_s = self.busy_timeout_s if timeout_s is None else timeout_s
            begin_immediate(conn, wait_s, self.path, self.busy_timeout_s)
            try:
                yield conn
            except sqlite3.Error as exc:
                rollback(conn)
                self._run_deferred(False)
                raise catalog_error(f"cannot write the cache catalog {self.path}", exc) from exc
            except BaseException:
                rollback(conn)
                self._run_deferred(False)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                rollback(conn)
                self._run_deferred(False)
                what = f"cannot commit to the cache catalog {self.path}"
                raise catalog_error(what, exc) from exc
        self._run_deferred(True)
        if self.wal_bytes() > WAL_LIMIT // 2:
            self.shrink_wal(0.5)  # concurrent readers kept the WAL from resetting

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (a consistent snapshot; writes nothing, takes no lock)."""
        with _FORK_GUARD.hold():
            conn = self._conn()
            _abandon(conn)
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise CacheError(f"cache catalog {self.path} is unavailable: {exc}") from exc
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def shrink_wal(self, timeout_s: float = 2.0) -> bool:
        """Checkpoint the WAL into the database and truncate it (waits up to
        ``timeout_s`` for readers; best effort). Under many concurrent readers a WAL may
        grow past :data:`WAL_LIMIT`; the cap counts it, so the tier shrinks it when it
        needs room. Returns whether it did; after a try that timed out, tries in the
        next second return False at once."""
        if time.monotonic() < self._stuck_until:
            return False
        with _FORK_GUARD.hold():
            done = self._shrink_wal(timeout_s)
        if not done:
            self._stuck_until = time.monotonic() + 1.0
        return done

    def _shrink_wal(self, timeout_s: float) -> bool:
        return checkpoint_truncate(self._conn(), timeout_s, self.busy_timeout_s)

    def db_bytes(self) -> int:
        """Bytes the database file takes or will take once the WAL is checkpointed into
        it (its pages may still sit in the WAL)."""
        try:
            on_disk = os.stat(self.path).st_blocks * 512
        except FileNotFoundError:
            on_disk = 0
        conn = self._conn()
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return max(on_disk, pages * size)

    def wal_bytes(self) -> int:
        """Disk bytes of the WAL now (0 when it does not exist)."""
        try:
            return os.stat(f"{self.path}-wal").st_blocks * 512
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            with _FORK_GUARD.hold():
                conn.close()
        self._local.conn = None

    # -------------------------------------------------------------------- rows
    @staticmethod
    def row(conn: sqlite3.Connection, name: str) -> EntryRow | None:
        """The entry ``name`` or None (a primary-key lookup)."""
        r = conn.execute(f"SELECT {_COLUMNS} FROM entries WHERE name=?", (name,)).fetchone()
        return None if r is None else _to_row(r)

    @staticmethod
    def rows(conn: sqlite3.Connection, state: EntryState | None = None) -> list[EntryRow]:
        """Every entry (in ``state`` if given), least recently used first (a full scan:
        for maintenance and listings, never on the open/close path)."""
        sql = f"SELECT {_COLUMNS} FROM entries"
        args: tuple[int, ...] = ()
        if state is not None:
            sql += " WHERE state=?"
            args = (int(state),)
        return [_to_row(r) for r in conn.execute(sql + " ORDER BY last_use, name", args)]

    @staticmethod
    def names_in(conn: sqlite3.Connection, state: EntryState) -> list[str]:
        """Names of the entries in ``state`` (an index range scan)."""
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT name FROM entries WHERE state=? ORDER BY last_use, name", (int(state),)
            )
        ]

    @staticmethod
    def lru_page(
        conn: sqlite3.Connection, after: tuple[int, str] | None, limit: int = 32
    ) -> list[tuple[str, int, int]]:
        """Up to ``limit`` READY entries ``(name, size, last_use)``, least recently used
        first, after the position ``after`` (an index range scan)."""
        if after is None:
            cur = conn.execute(
                "SELECT name, size, last_use FROM entries WHERE state=? "
                "ORDER BY last_use, name LIMIT ?",
                (int(EntryState.READY), limit),
            )
        else:
            cur = conn.execute(
                "SELECT name, size, last_use FROM entries WHERE state=? AND "
                "(last_use, name) > (?, ?) ORDER BY last_use, name LIMIT ?",
                (int(EntryState.READY), after[0], after[1], limit),
            )
        return [(str(n), int(s), int(u)) for n, s, u in cur]

    @staticmethod
    def _tick(conn: sqlite3.Connection) -> int:
        return int(
            conn.execute(
                "UPDATE meta SET value=value+1 WHERE key='clock' RETURNING value"
            ).fetchone()[0]
        )

    def put(
        self,
        conn: sqlite3.Connection,
        name: str,
        dataset: str,
        shard: str,
        checksum: str,
        size: int,
        state: EntryState,
        error: str | None = None,
        boot: str | None = None,
    ) -> None:
        """Insert or update the entry ``name`` in ``state`` and mark it used now
        (``boot``: see :attr:`EntryRow.boot`)."""
        now = time.time()
        conn.execute(
            f"INSERT INTO entries({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(name) DO UPDATE SET dataset=excluded.dataset, shard=excluded.shard, "
            "checksum=excluded.checksum, size=excluded.size, state=excluded.state, "
            "last_use=excluded.last_use, touched=excluded.touched, error=excluded.error, "
            "failed_at=excluded.failed_at, boot=excluded.boot",
            (
                name,
                dataset,
                shard,
                checksum,
                size,
                int(state),
                self._tick(conn),
                now,
                error,
                now if state is EntryState.FAILED else None,
                boot,
            ),
        )

    @staticmethod
    def mark_durable(conn: sqlite3.Connection, name: str, checksum: str) -> None:
        """Record that the entry ``name`` (still of ``checksum``) is known to be on disk."""
        conn.execute("UPDATE entries SET boot=NULL WHERE name=? AND checksum=?", (name, checksum))

    def touch(self, conn: sqlite3.Connection, name: str) -> None:
        """Mark ``name`` most recently used."""
        conn.execute(
            "UPDATE entries SET last_use=?, touched=? WHERE name=?",
            (self._tick(conn), time.time(), name),
        )

    @staticmethod
    def delete(conn: sqlite3.Connection, name: str, state: EntryState | None = None) -> None:
        """Drop the entry ``name`` (only if it is in ``state``, when given)."""
        if state is None:
            conn.execute("DELETE FROM entries WHERE name=?", (name,))
        else:
            conn.execute("DELETE FROM entries WHERE name=? AND state=?", (name, int(state)))

    # ------------------------------------------------------------ totals and cap
    @staticmethod
    def meta(conn: sqlite3.Connection) -> dict[str, int | None]:
        """The running totals (``used``: blocks of READY and FETCHING entries;
        ``ready_bytes``, ``ready_count``, ``fetching_bytes``) and the stored ``cap``."""
        return {
            str(k): (None if v is None else int(v))
            for k, v in conn.execute("SELECT key, value FROM meta")
        }

    @staticmethod
    def used(conn: sqlite3.Connection) -> int:
        """Blocks taken by READY entries plus those reserved by downloads in progress."""
        return int(conn.execute("SELECT value FROM meta WHERE key='used'").fetchone()[0])

    @staticmethod
    def cap(conn: sqlite3.Connection) -> int | None:
        """The byte cap stored in the cache directory (None: no cap)."""
        r = conn.execute("SELECT value FROM meta WHERE key='cap'").fetchone()
        return None if r is None or r[0] is None else int(r[0])

    @staticmethod
    def set_cap(conn: sqlite3.Connection, cap: int | None) -> None:
        """Store the byte cap (None: no cap)."""
        conn.execute("UPDATE meta SET value=? WHERE key='cap'", (cap,))

    # ---------------------------------------------------------------- counters
    @staticmethod
    def bump(conn: sqlite3.Connection, **deltas: float) -> None:
        """Add to the lifetime counters."""
        for key, delta in deltas.items():
            if delta:
                conn.execute(
                    "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) "
                    "DO UPDATE SET value=value+excluded.value",
                    (key, delta),
                )

    @staticmethod
    def counters(conn: sqlite3.Connection) -> dict[str, float]:
        """The lifetime counters (hits, misses, fetches, …) of every process."""
        return {k: float(v) for k, v in conn.execute("SELECT name, value FROM counters")}


def _abandon(conn: sqlite3.Connection) -> None:
    """Roll back a transaction an interrupt left open on this thread's connection (a
    KeyboardInterrupt between ``BEGIN`` and its ``try``, or inside ``COMMIT``): nobody
    else uses the connection, so it is abandoned."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _to_row(r: Any) -> EntryRow:
    return EntryRow(
        name=str(r[0]),
        dataset=str(r[1]),
        shard=str(r[2]),
        checksum=str(r[3]),
        size=int(r[4]),
        state=EntryState(r[5]),
        last_use=int(r[6]),
        touched=float(r[7]),
        error=None if r[8] is None else str(r[8]),
        failed_at=None if r[9] is None else float(r[9]),
        boot=None if r[10] is None else str(r[10]),
    )
