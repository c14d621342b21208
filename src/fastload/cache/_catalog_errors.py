"""What the catalog's write transactions do when sqlite fails: end the transaction
once, and raise fastload's error (``catalog.py`` keeps the rest)."""

from __future__ import annotations

import contextlib
import sqlite3

from fastload.errors import CacheError, CacheFullError


def rollback(conn: sqlite3.Connection) -> None:
    """End the transaction if sqlite has not already (a failed COMMIT of a full disk
    rolls back by itself, and a second ROLLBACK would raise over the first error)."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def catalog_error(what: str, exc: sqlite3.Error) -> CacheError:
    """``exc`` as fastload's error: a full disk is a :class:`CacheFullError` (the
    readers then read uncached, as for a shard that does not fit), anything else a
    :class:`CacheError` naming the catalog (benchmarks/soak.py: a disk filled by another
    tenant raised sqlite's own "database or disk is full" out of a loader)."""
    full = getattr(exc, "sqlite_errorcode", None) == getattr(sqlite3, "SQLITE_FULL", 13) or (
        "disk is full" in str(exc)
    )
    cls = CacheFullError if full else CacheError
    return cls(f"{what}: {exc}" + ("; the cache's filesystem is full" if full else ""))
