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
