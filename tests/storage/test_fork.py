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


def _child_backend(store: ObjectStore, parent_backend_id: int, queue: Queue[Any]) -> None:
    try:
        backend = store._get_backend()
        other = open_store(store.url(), {**store._options}, fetch=FETCH)
        queue.put((id(backend) != parent_backend_id, other._get_backend() is backend,
                   store.read("obj")))  # fmt: skip
    except BaseException as exc:
        queue.put(repr(exc))


def test_stores_of_one_endpoint_share_one_client_and_a_child_makes_its_own(
    seaweed: SeaweedServer,
) -> None:
    """Making an S3 client costs ~0.1 s: every store of a process on the same endpoint,
    credentials and config uses one, whatever its bucket; a forked child makes its own
    (the parent's sockets and loop are not its to use)."""
    a = open_store(seaweed.new_url(), seaweed.storage_options, fetch=FETCH)
    b = open_store(seaweed.new_url(), seaweed.storage_options, fetch=FETCH)
    a.write_bytes("obj", b"shared")
    assert a._get_backend() is b._get_backend()
    other_config = open_store(a.url(), seaweed.storage_options, fetch=FetchConfig())
    assert other_config._get_backend() is not a._get_backend()
    wrong_key = {**seaweed.storage_options, "key": "someone-else"}
    assert open_store(a.url(), wrong_key, fetch=FETCH)._get_backend() is not a._get_backend()
    ctx = mp.get_context("fork")
    queue: Queue[Any] = ctx.Queue()
    p = ctx.Process(target=_child_backend, args=(a, id(a._get_backend()), queue))
    p.start()
    got = queue.get(timeout=60)
    p.join(timeout=30)
    assert got == (True, True, b"shared"), got
    assert a.read("obj") == b"shared"  # the parent's client still works
