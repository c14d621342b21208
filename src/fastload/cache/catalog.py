"""The disk tier's metadata: one sqlite database (WAL mode) shared by every process.

It records, per entry, the state (:class:`EntryState`), size, checksum and a logical
last-use clock, plus the pins readers hold (pid + process start time, so pins of dead
processes and recycled pids are ignored) and lifetime counters for ``fastload cache
stats``. Connections are opened lazily per process and thread and re-opened after a
fork (DataLoader workers fork), so nothing inherited across ``fork`` is reused.
"""

from __future__ import annotations

import enum
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload.cache.policy import Candidate
from fastload.errors import CacheError

__all__ = ["Catalog", "EntryRow", "EntryState", "connect_wal", "pid_alive", "process_start"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries(
    name TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    shard TEXT NOT NULL,
    checksum TEXT NOT NULL,
    size INTEGER NOT NULL,
    state INTEGER NOT NULL,
    last_use INTEGER NOT NULL,
    touched REAL NOT NULL,
    owner_pid INTEGER NOT NULL,
    error TEXT,
    failed_at REAL
);
CREATE TABLE IF NOT EXISTS pins(
    name TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (name, pid, start)
);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value REAL NOT NULL);
"""

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
class EntryRow:
    """One row of the ``entries`` table."""

    name: str
    dataset: str
    shard: str
    checksum: str
    size: int
    state: EntryState
    last_use: int
    touched: float
    owner_pid: int
    error: str | None
    failed_at: float | None


def process_start(pid: int) -> str:
    """Return the start time of ``pid`` (clock ticks since boot, from ``/proc``) or
    ``""`` where that is not available; with the pid it identifies a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def pid_alive(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` (started at ``start`` if given) is alive; zombies count as
    dead, and so does a recycled pid whose start time differs."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return True
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return False
    return not (start and len(fields) > 19 and fields[19] != start)


def connect_wal(path: str | os.PathLike[str], busy_timeout_s: float) -> sqlite3.Connection:
    """Open the sqlite database at ``path`` in WAL mode, shared by many processes.

    Switching a new database to WAL needs an exclusive lock, and sqlite answers
    "database is locked" at once (without its busy handler) when several processes
    open a fresh database together: retry with backoff until ``busy_timeout_s``.
    Raises :class:`sqlite3.Error` if it still fails.
    """
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.005
    while True:
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            transient = "locked" in str(exc) or "busy" in str(exc)
            if not transient or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.25)


class Catalog:
    """Access to the cache's sqlite database at ``path``.

    Every write goes through :meth:`txn` (``BEGIN IMMEDIATE`` … ``COMMIT``), so a
    read-check-write such as "make room, then reserve" is atomic across processes.
    Raises :class:`CacheError` when the database cannot be opened or stays locked
    past ``busy_timeout_s``.
    """

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._me = (os.getpid(), process_start(os.getpid()))
        with self.txn() as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    # -------------------------------------------------------------- connections
    def _conn(self) -> sqlite3.Connection:
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == pid:
            return conn
        if conn is not None:
            _INHERITED.append(conn)
        if self._me[0] != pid:
            self._me = (pid, process_start(pid))
        try:
            conn = connect_wal(self.path, self.busy_timeout_s)
        except sqlite3.Error as exc:
            raise CacheError(f"cannot open the cache catalog {self.path}: {exc}") from exc
        self._local.conn = conn
        self._local.pid = pid
        return conn

    @contextmanager
    def txn(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; rolled back if the block raises."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise CacheError(f"cache catalog {self.path} is unavailable: {exc}") from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise CacheError(f"cannot commit to the cache catalog {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    # -------------------------------------------------------------------- rows
    @staticmethod
    def row(conn: sqlite3.Connection, name: str) -> EntryRow | None:
        """The entry ``name`` or None."""
        r = conn.execute(
            "SELECT name, dataset, shard, checksum, size, state, last_use, touched, "
            "owner_pid, error, failed_at FROM entries WHERE name=?",
            (name,),
        ).fetchone()
        return None if r is None else _to_row(r)

    @staticmethod
    def rows(conn: sqlite3.Connection, state: EntryState | None = None) -> list[EntryRow]:
        """Every entry (in ``state`` if given), least recently used first."""
        sql = (
            "SELECT name, dataset, shard, checksum, size, state, last_use, touched, "
            "owner_pid, error, failed_at FROM entries"
        )
        args: tuple[int, ...] = ()
        if state is not None:
            sql += " WHERE state=?"
            args = (int(state),)
        return [_to_row(r) for r in conn.execute(sql + " ORDER BY last_use, name", args)]

    @staticmethod
    def _clock(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT COALESCE(MAX(last_use), 0) + 1 FROM entries").fetchone()[0])

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
    ) -> None:
        """Insert or replace the entry ``name`` in ``state`` and mark it used now."""
        now = time.time()
        conn.execute(
            "INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                name,
                dataset,
                shard,
                checksum,
                size,
                int(state),
                self._clock(conn),
                now,
                os.getpid(),
                error,
                now if state is EntryState.FAILED else None,
            ),
        )

    def touch(self, conn: sqlite3.Connection, name: str) -> None:
        """Mark ``name`` most recently used."""
        conn.execute(
            "UPDATE entries SET last_use=?, touched=? WHERE name=?",
            (self._clock(conn), time.time(), name),
        )

    @staticmethod
    def delete(conn: sqlite3.Connection, name: str) -> None:
        """Drop the entry ``name`` (its pins stay until their processes release them)."""
        conn.execute("DELETE FROM entries WHERE name=?", (name,))

    # -------------------------------------------------------------------- pins
    def add_pin(self, conn: sqlite3.Connection, name: str) -> None:
        """Register one pin of ``name`` by this process."""
        pid, start = self._me if self._me[0] == os.getpid() else (os.getpid(), "")
        conn.execute(
            "INSERT INTO pins VALUES (?,?,?,1) ON CONFLICT(name, pid, start) "
            "DO UPDATE SET count=count+1",
            (name, pid, start),
        )

    def remove_pin(self, conn: sqlite3.Connection, name: str) -> None:
        """Release one pin of ``name`` held by this process."""
        pid, start = self._me if self._me[0] == os.getpid() else (os.getpid(), "")
        conn.execute(
            "UPDATE pins SET count=count-1 WHERE name=? AND pid=? AND start=?", (name, pid, start)
        )
        conn.execute("DELETE FROM pins WHERE count<=0")

    @staticmethod
    def live_pins(conn: sqlite3.Connection) -> dict[str, int]:
        """Pin counts per entry from live processes; pins of dead ones are deleted."""
        out: dict[str, int] = {}
        dead: list[tuple[int, str]] = []
        alive: dict[tuple[int, str], bool] = {}
        for name, pid, start, count in conn.execute("SELECT name, pid, start, count FROM pins"):
            ok = alive.get((pid, start))
            if ok is None:
                ok = alive[(pid, start)] = pid_alive(pid, start)
            if ok:
                out[name] = out.get(name, 0) + int(count)
            else:
                dead.append((pid, start))
        for pid, start in set(dead):
            conn.execute("DELETE FROM pins WHERE pid=? AND start=?", (pid, start))
        return out

    def occupants(self, conn: sqlite3.Connection, exclude: str = "") -> list[Candidate]:
        """READY and FETCHING entries as eviction candidates (FETCHING ones, and READY
        ones with live pins, are pinned: never evicted)."""
        pins = self.live_pins(conn)
        out = []
        abandoned = []
        for r in conn.execute(
            "SELECT name, size, last_use, state, owner_pid FROM entries "
            "WHERE state IN (?, ?) AND name<>?",
            (int(EntryState.READY), int(EntryState.FETCHING), exclude),
        ):
            if r[3] == EntryState.FETCHING and not pid_alive(int(r[4])):
                # its downloader died (SIGKILL, OOM killer): the reservation is void; the
                # .part file it left is swept by the next DiskTier start
                abandoned.append(r[0])
                continue
            pinned = r[3] == EntryState.FETCHING or pins.get(r[0], 0) > 0
            out.append(Candidate(r[0], int(r[1]), float(r[2]), pinned))
        for name in abandoned:
            conn.execute(
                "DELETE FROM entries WHERE name=? AND state=?", (name, int(EntryState.FETCHING))
            )
        return out

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
        owner_pid=int(r[8]),
        error=None if r[9] is None else str(r[9]),
        failed_at=None if r[10] is None else float(r[10]),
    )
