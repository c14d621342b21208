"""Loaders that are never closed (as torch's DataLoader needs no close) leave nothing
running: a new ``fastload.DataLoader`` every epoch, iterated fully, partly, not at
all, over a real SeaweedFS, keeps the process's threads and open files bounded; an
iteration that ends, or whose iterator is dropped, stops the threads it started;
``close()`` ends an abandoned iteration."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.config import CacheConfig
from fastload.loader.shared_tier import SHM_DIR

N = 160
#: the dataset's cache prefetches with these threads for as long as the dataset lives
#: (one set per dataset, not per loader)
PREFETCH = "fastload-prefetch-"


def _jpeg(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (i % 256, (7 * i) % 256, 90)).save(buf, format="JPEG")
    return buf.getvalue()


def _write(url: str, options: dict[str, Any], images: bool) -> None:
    with fastload.ShardWriter(url, shard_size="16KB", storage_options=options) as w:
        for i in range(N):
            sample: dict[str, Any] = {"__key__": f"s{i:05d}", "cls": i % 10}
            sample["jpg" if images else "bin"] = _jpeg(i) if images else bytes([i % 251]) * 300
            w.write(sample)


def _loader_threads(deadline_s: float = 10.0) -> list[str]:
    """The fastload threads other than the dataset's prefetch threads still alive
    after a collection, once those that were told to stop have ended (waited for up
    to ``deadline_s``: a stopped thread ends after the load it is in)."""
    gc.collect()
    end = time.monotonic() + deadline_s
    while True:
        alive = [
            t
            for t in threading.enumerate()
            if t.name.startswith("fastload-")
            and not t.name.startswith(PREFETCH)
            # the process's lock heartbeat beats for the shards the dataset holds open
            # (fastload.cache.locks), not for the loader; it ends with the last lock
            and t.name != "fastload-lock-heartbeat"
        ]
        if not alive or time.monotonic() >= end:
            return sorted(t.name for t in alive)
        alive[0].join(0.05)


def _prefetch_threads() -> int:
    return sum(t.name.startswith(PREFETCH) for t in threading.enumerate())


def _file_fds(deadline_s: float = 10.0) -> int:
    """Descriptors other than sockets: connection pools grow to their bounds (the
    direct path's idle connections, aiohttp's pool) and are shared by the datasets of
    a process, so they are not what a leaked dataset would hold.

    Counted once the queue feeder threads of torch's shut-down worker queues have
    ended (up to ``deadline_s``): ``multiprocessing.Queue`` closes its pipe's write
    end from that thread, after ``_shutdown_workers`` returns, so a loaded machine
    can otherwise catch a dropped loader's pipes on their way out (CI saw 106 of 104)."""
    end = time.monotonic() + deadline_s
    for t in threading.enumerate():
        if t.name == "QueueFeederThread":
            t.join(max(0.0, end - time.monotonic()))
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own)
            n += not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


@pytest.mark.s3
@pytest.mark.parametrize("kind", ["raw", "decoded", "workers"])
def test_a_new_loader_each_epoch_never_closed_keeps_threads_and_fds_bounded(
    seaweed: Any, tmp_path: Path, kind: str
) -> None:
    url = seaweed.new_url("ds")
    opts = seaweed.storage_options
    _write(url, opts, images=kind == "decoded")
    ds = fastload.StreamingDataset(
        url,
        shuffle=True,
        cache_dir=tmp_path / "cache",
        storage_options=opts,
        decode="tensor" if kind == "decoded" else None,
        size=(24, 24) if kind == "decoded" else None,
    )
    kwargs: dict[str, Any] = {"transport": "cache"} if kind == "decoded" else {}
    if kind == "workers":
        kwargs = {"num_workers": 2, "plan_in_workers": True}
    fds: list[int] = []
    try:
        for epoch in range(8):
            loader = fastload.DataLoader(ds, batch_size=16, **kwargs)
            pattern = epoch % 4
            if pattern == 0:  # a whole epoch
                assert sum(len(b["__key__"]) for b in loader) == N
            elif pattern == 1:  # a break mid-epoch
                for _ in loader:
                    break
            elif pattern == 2:  # iter() and nothing more
                it = iter(loader)
                del it
            else:  # one batch, then the iterator dropped with the loader
                it = iter(loader)
                assert len(next(it)["__key__"]) == 16
                del it
            del loader
            assert _loader_threads() == [], f"epoch {epoch}"
            assert _prefetch_threads() <= CacheConfig().prefetch_workers
            fds.append(_file_fds())
        # the cache's files, the store's sockets and the dataset's open shards were
        # opened by the first epochs; later loaders open nothing that stays open
        assert max(fds[4:]) <= max(fds[:4]), fds
    finally:
        ds.close()
    assert _prefetch_threads() == 0


@pytest.mark.s3
def test_an_iterator_dropped_before_its_first_batch_stops_its_threads(
    seaweed: Any, tmp_path: Path
) -> None:
    url = seaweed.new_url("ds")
    _write(url, seaweed.storage_options, images=False)
    ds = fastload.ShardedDataset(
        url, cache_dir=tmp_path / "cache", storage_options=seaweed.storage_options
    )
    loader = fastload.DataLoader(ds, batch_size=16, shuffle=True)
    try:
        for _ in range(3):  # the loader is kept: only the iterators go
            it = iter(loader)  # stages the epoch's shards and loads their indexes
            del it
            assert _loader_threads() == []
        assert sum(len(b["__key__"]) for b in loader) == N  # and it still iterates
        assert _loader_threads() == []
    finally:
        loader.close()
        ds.close()


@pytest.mark.s3
@pytest.mark.parametrize("decoded", [False, True], ids=["raw", "decoded"])
def test_close_ends_an_abandoned_iteration_and_its_threads(
    seaweed: Any, tmp_path: Path, decoded: bool
) -> None:
    url = seaweed.new_url("ds")
    _write(url, seaweed.storage_options, images=decoded)
    ds = fastload.StreamingDataset(
        url,
        cache_dir=tmp_path / "cache",
        storage_options=seaweed.storage_options,
        decode="tensor" if decoded else None,
        size=(24, 24) if decoded else None,
    )
    loader = fastload.DataLoader(ds, batch_size=16, transport="cache")
    try:
        it = iter(loader)
        next(it)
        next(it)
        assert _loader_threads(deadline_s=0.0) != []  # the builder (and index) threads
        loader.close()
        # joined by close(), not left to end on their own
        assert _loader_threads(deadline_s=0.0) == []
        with pytest.raises(StopIteration):
            next(it)
        # the loader still iterates: the rest of the epoch (2 batches were consumed)
        assert sum(len(b["__key__"]) for b in loader) == N - 32
        assert _loader_threads() == []
    finally:
        ds.close()


def _shared_tiers() -> set[str]:
    """This process's loader tiers in shared memory (other jobs make their own)."""
    mine = f"fastload-loader-{os.getpid()}-"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


@pytest.mark.s3
def test_a_new_loader_each_epoch_without_cache_dir_leaves_no_shared_tier(
    seaweed: Any,
) -> None:
    # the usual loop: `loader = DataLoader(...)` each epoch builds the new loader while
    # the old one is still alive, then drops the old one; workers without a cache_dir
    # make each loader give the dataset a shared tier in memory
    url = seaweed.new_url("ds")
    _write(url, seaweed.storage_options, images=False)
    before = _shared_tiers()
    ds = fastload.ShardedDataset(url, storage_options=seaweed.storage_options)
    try:
        loader = None
        for _ in range(3):
            loader = fastload.DataLoader(
                ds, batch_size=16, shuffle=True, num_workers=2, plan_in_workers=True
            )
            assert sum(len(b["__key__"]) for b in loader) == N
            # only the live loader's tier is there, the previous one's is gone
            assert loader._shared_dir is not None
            assert _shared_tiers() - before == {os.path.basename(loader._shared_dir)}
        del loader
        gc.collect()
        assert _shared_tiers() == before
        # the dataset is as it was given: no cache_dir, its own RAM tier
        assert ds.source.cache_dir is None
        assert ds[N - 1]["__key__"] == f"s{N - 1:05d}"
        assert _shared_tiers() == before
    finally:
        ds.close()


def _all_fastload_threads(deadline_s: float = 10.0) -> list[str]:
    """Every fastload thread still alive after a collection, once idle prefetch threads
    have ended (they end after ``prefetch._IDLE_EXIT_S`` with nothing to do)."""
    gc.collect()
    end = time.monotonic() + deadline_s
    while True:
        alive = [t for t in threading.enumerate() if t.name.startswith("fastload-")]
        if not alive or time.monotonic() >= end:
            return sorted(t.name for t in alive)
        alive[0].join(0.1)
        gc.collect()


@pytest.mark.s3
@pytest.mark.parametrize("cached", [True, False], ids=["cache-dir", "no-cache-dir"])
def test_a_new_dataset_and_loader_each_epoch_never_closed_leak_nothing(
    seaweed: Any, tmp_path: Path, cached: bool
) -> None:
    """A job that makes its dataset and its loader anew each epoch and closes neither:
    idle prefetch threads end, and a collected source's pins release their
    descriptors and flocks (before: 16 threads more per dataset without ``cache_dir``,
    ~9 descriptors more per dataset with one)."""
    url = seaweed.new_url("ds")
    _write(url, seaweed.storage_options, images=False)
    fds = []
    for epoch in range(6):
        ds = fastload.StreamingDataset(
            url,
            shuffle=True,
            storage_options=seaweed.storage_options,
            cache_dir=tmp_path / "cache" if cached else None,
        )
        loader = fastload.DataLoader(ds, batch_size=16)
        if epoch % 2:
            it = iter(loader)
            next(it)
            del it
        else:
            assert sum(len(b["__key__"]) for b in loader) == N
        del loader, ds
        assert _all_fastload_threads() == [], f"epoch {epoch}"
        fds.append(_file_fds())
    assert max(fds[3:]) <= max(fds[:3]), fds


def test_close_stops_persistent_workers(tmp_path: Path) -> None:
    """torch keeps a persistent-workers iterator, and its worker processes, until the
    loader is collected; ``close()`` ends them, and a later epoch starts new ones."""
    import multiprocessing as mp

    url = str(tmp_path / "ds")
    _write(url, {}, images=False)
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache")
    loader = fastload.DataLoader(
        ds, batch_size=16, num_workers=2, persistent_workers=True, plan_in_workers=True
    )
    try:
        assert sum(len(b["__key__"]) for b in loader) == N
        workers = [p for p in mp.active_children() if p.is_alive()]
        assert len(workers) == 2  # kept between epochs: persistent
        loader.close()
        for p in workers:
            p.join(10.0)
        assert [p for p in workers if p.is_alive()] == []
        assert sum(len(b["__key__"]) for b in loader) == N  # new workers, whole epoch
        loader.close()
        assert [p for p in mp.active_children() if p.is_alive()] == []
    finally:
        loader.close()
        ds.close()
