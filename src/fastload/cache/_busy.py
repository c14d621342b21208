"""Waiting for sqlite's locks in short slices, so that Ctrl-C and signal handlers act.

sqlite waits for a lock in its busy handler, in C: a Python signal handler (the one
that raises :class:`KeyboardInterrupt`, or a SIGTERM handler) runs only once sqlite
returns. With one wait of the whole ``busy_timeout_s`` (60 s), a process interrupted
while another one holds the catalog's write lock (stopped with SIGSTOP inside a write)
went on waiting for up to a minute (the 30-minute soak: 1 pod of 85 not out 30 s after
Ctrl-C). So every wait for a lock here is taken :data:`BUSY_SLICE_S` at a time and
retried in Python until the same deadline: a signal is acted on within a slice, and
past the deadline the same error is raised as before. ``catalog.py`` keeps the rest.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastload.errors import CacheError, CatalogBusy

#: The longest one attempt at a lock waits in sqlite's busy handler, where no signal
#: handler can run.
BUSY_SLICE_S = 0.05


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is sqlite's "database is locked" or "busy" (worth a retry)."""
    return "locked" in str(exc) or "busy" in str(exc)


def set_busy_timeout(conn: sqlite3.Connection, seconds: float) -> None:
    """Let ``conn``'s statements wait up to ``seconds`` in sqlite's busy handler."""
    conn.execute(f"PRAGMA busy_timeout={max(int(seconds * 1000), 0)}")


def begin_immediate(
    conn: sqlite3.Connection, timeout_s: float, path: Path, restore_s: float
) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``, retried until ``timeout_s`` have passed, each try
    waiting at most :data:`BUSY_SLICE_S` in sqlite (sqlite also answers "database is
    locked" at once, without its busy handler: seen once in the test suites, when three
    forked DataLoader workers opened one fresh catalog together). Afterwards ``conn``
    waits ``restore_s`` again. Raises :class:`CatalogBusy` past the deadline,
    :class:`CacheError` for any other failure; an interrupt propagates between tries."""
    set_busy_timeout(conn, min(BUSY_SLICE_S, timeout_s))
    try:
        execute(conn, "BEGIN IMMEDIATE", timeout_s=timeout_s, where=f"cache catalog {path}")
    finally:
        set_busy_timeout(conn, restore_s)


def execute(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any] = (),
    *,
    timeout_s: float,
    where: str,
) -> sqlite3.Cursor:
    """Run the one statement ``sql`` on the autocommit connection ``conn`` (a try that
    found the database locked changed nothing), retried until ``timeout_s`` have
    passed, each try waiting in sqlite for ``conn``'s busy timeout, which the caller
    sets to :data:`BUSY_SLICE_S` once (:func:`set_busy_timeout`, or ``timeout=`` when
    connecting): no statement is added per call (a query costs ~3 us; one more was
    ~1.6 times that). Returns the cursor (a query's first row is read).
    Raises :class:`CatalogBusy` past the deadline and :class:`CacheError` for any other
    sqlite failure, both naming ``where`` (the database, in words); an interrupt
    propagates between tries."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            return conn.execute(sql, params)
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise CacheError(f"{where} is unavailable: {exc}") from exc
            if time.monotonic() + delay > deadline:
                raise CatalogBusy(
                    f"{where} is unavailable: {exc} (it stayed locked for {timeout_s:.1f} s: "
                    "another process is stopped or hung inside a write)"
                ) from exc
        time.sleep(delay)  # Python's sleep: signal handlers run here
        delay = min(2 * delay, 0.05)


def connect_wal(path: str | os.PathLike[str], busy_timeout_s: float) -> sqlite3.Connection:
    """Open the sqlite database at ``path`` in WAL mode, shared by many processes; its
    statements then wait up to ``busy_timeout_s`` for a lock.

    Switching a new database to WAL needs an exclusive lock, and sqlite answers
    "database is locked" at once (without its busy handler) when several processes
    open a fresh database together: retried with backoff until ``busy_timeout_s``, each
    try waiting at most :data:`BUSY_SLICE_S` in sqlite (so that Ctrl-C acts).
    Raises :class:`sqlite3.Error` if it still fails.
    """
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.005
    slice_s = min(BUSY_SLICE_S, busy_timeout_s)
    while True:
        conn = sqlite3.connect(path, timeout=slice_s, isolation_level=None, check_same_thread=False)
        try:
            set_busy_timeout(conn, slice_s)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            set_busy_timeout(conn, busy_timeout_s)
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if not is_busy(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.25)


def checkpoint_truncate(conn: sqlite3.Connection, timeout_s: float, restore_s: float) -> bool:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` on ``conn``, retried until ``timeout_s`` (each
    try waiting at most :data:`BUSY_SLICE_S` in sqlite for readers and the writer);
    afterwards ``conn`` waits ``restore_s`` again. Returns whether the WAL was
    checkpointed whole and truncated; False on any sqlite error (best effort).

    sqlite answers SQLITE_BUSY at once, without its busy handler, while another
    connection runs a checkpoint (every commit past 32 pages runs a passive one): with
    several busy processes a single try failed 983 times in 1,609 under the hammer test
    and the WAL grew to 976 KiB, past its 512 KiB reserve and the cap. So: try again
    until the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    try:
        while True:
            set_busy_timeout(conn, min(deadline - time.monotonic(), BUSY_SLICE_S))
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    return False
                busy = 1
            if not busy:
                return True
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
    except sqlite3.Error:
        return False
    finally:
        with contextlib.suppress(sqlite3.Error):
            set_busy_timeout(conn, restore_s)
