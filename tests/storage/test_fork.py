"""An ObjectStore made in a parent keeps working in a forked child (fresh sockets/loop)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
from multiprocessing.queues import Queue
from typing import Any

import pytest

from fastload.config import FetchConfig
from fastload.storage import ObjectStore, open_store
from support.seaweed import SeaweedServer

FETCH = FetchConfig(part_size=128 * 1024, parallel_threshold=256 * 1024, concurrency=4)


def _child(store: ObjectStore, queue: Queue[Any]) -> None:
    try:
        data = store.read("obj")
        buf = bytearray()
        import io

        out = io.BytesIO()
        store.download("obj", out)
        buf = bytearray(out.getvalue())
        store.write_bytes(f"from-child-{os.getpid()}", b"child")
        queue.put(
            (hashlib.sha256(data).hexdigest(), hashlib.sha256(buf).hexdigest(), store.stats())
        )
    except BaseException as exc:  # report, so the parent's assertion shows the cause
        queue.put(repr(exc))


def _run_children(store: ObjectStore, n: int) -> list[Any]:
    ctx = mp.get_context("fork")
    queue: Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(store, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("backend", ["s3", "file"])
def test_store_works_in_forked_children(
    backend: str, seaweed: SeaweedServer, tmp_path: object
) -> None:
    if backend == "s3":
        store = open_store(seaweed.new_url(), seaweed.storage_options, fetch=FETCH)
    else:
        store = open_store(os.path.join(str(tmp_path), "root"), fetch=FETCH)
    data = os.urandom(1_000_000)
    store.write_bytes("obj", data)
    assert store.read("obj") == data  # the parent's client and event loop are live now
    digest = hashlib.sha256(data).hexdigest()
    for got in _run_children(store, 3):
        assert not isinstance(got, str), got
        assert got[0] == digest
        assert got[1] == digest
        # Counters are per process: the child's start from zero.
        assert got[2].bytes_read == 2 * len(data)
    assert store.read("obj") == data  # and the parent still works
    assert len([n for n in store.list() if n.startswith("from-child-")]) == 3


def test_store_pickles_without_its_connections(seaweed: SeaweedServer) -> None:
    store = open_store(seaweed.new_url(), seaweed.storage_options)
    store.write_bytes("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read("k") == b"v"
    assert clone.stats().requests == 1
