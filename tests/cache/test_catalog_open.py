"""Many processes opening a brand-new cache catalog at the same instant all succeed."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from fastload.cache.catalog import Catalog


def _open(
    path: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    barrier.wait()
    try:
        cat = Catalog(path)
        with cat.txn() as conn:
            conn.execute("SELECT count(*) FROM entries").fetchone()
        out.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(f"{type(exc).__name__}: {exc}")


def test_fresh_catalog_opened_by_many_processes_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(8):
        path = str(tmp_path / f"round{round_}" / "catalog.sqlite")
        Path(path).parent.mkdir()
        barrier = ctx.Barrier(10)
        out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [ctx.Process(target=_open, args=(path, barrier, out)) for _ in range(10)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        assert results == ["ok"] * 10, results


def _answer_busy_at_once(cat: Catalog) -> None:
    """This thread's connection gets no busy handler: sqlite then answers "database is
    locked" at once, as it sometimes does with one (the case the retry is for)."""
    with cat.read() as conn:
        conn.execute("PRAGMA busy_timeout=0")


def test_a_write_transaction_waits_out_a_lock_sqlite_refused_at_once(tmp_path: Path) -> None:
    import sqlite3
    import threading

    path = tmp_path / "catalog.sqlite"
    cat = Catalog(path, busy_timeout_s=10.0)
    _answer_busy_at_once(cat)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock for 0.3 s
    committing = threading.Event()

    def commit() -> None:
        committing.set()  # before COMMIT: nothing can write until after this
        other.execute("COMMIT")

    threading.Timer(0.3, commit).start()
    with cat.txn() as conn:
        conn.execute("UPDATE meta SET value=value+1 WHERE key='clock'")
    assert committing.is_set()  # it waited for the other writer, not went around it
    other.close()


def test_a_lock_held_past_the_deadline_is_a_clear_error(tmp_path: Path) -> None:
    import sqlite3

    import pytest

    from fastload.errors import CacheError

    path = tmp_path / "catalog.sqlite"
    cat = Catalog(path, busy_timeout_s=0.3)
    _answer_busy_at_once(cat)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        locked = r"catalog\.sqlite is unavailable: database is locked"
        with pytest.raises(CacheError, match=locked), cat.txn():
            pass
    finally:
        other.execute("COMMIT")
        other.close()
