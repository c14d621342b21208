"""ShardCache facade: disk mode (pinned mmaps), RAM mode, small objects, prefetch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import CachedShard, ShardCache, dataset_id
from fastload.config import CacheConfig
from fastload.errors import CacheError
from fastload.shards.checksum import xxh3_128
from fastload.shards.manifest import ShardInfo

from .conftest import DATASET, SLACK, CountingFetch, blob


def shard_info(i: int, data: bytes) -> ShardInfo:
    return ShardInfo(
        name=f"shard-{i:06d}.tar",
        bytes=len(data),
        samples=1,
        checksum=xxh3_128(data),
        index_name=f"shard-{i:06d}.tar.idx",
        index_bytes=0,
        index_checksum=xxh3_128(b""),
    )


def test_disk_mode_maps_the_verified_file_and_pins_while_open(cache_dir: Path) -> None:
    data = blob(1, 50_000)
    info = shard_info(0, data)
    fetch = CountingFetch(data)
    cache = ShardCache(cache_dir, cache_limit="1MB")
    with cache.open_shard(DATASET, info, fetch) as shard:
        assert isinstance(shard, CachedShard)
        assert shard.path is not None
        assert shard.path.read_bytes() == data
        assert bytes(shard.data[100:200]) == data[100:200]
        assert shard.data.readonly
        assert len(shard) == len(data)
        assert cache.disk is not None
        assert [e.pins for e in cache.disk.entries()] == [1]
    assert shard.closed
    assert [e.pins for e in cache.disk.entries()] == [0]
    with cache.open_shard(DATASET, info, fetch) as again:
        assert bytes(again.data) == data
    assert fetch.calls == 1
    stats = cache.stats()
    assert (stats["disk"].misses, stats["disk"].hits) == (1, 1)
    cache.close()


def test_views_outliving_the_shard_keep_their_bytes(cache_dir: Path) -> None:
    data = blob(2, 10_000)
    cache = ShardCache(cache_dir)
    shard = cache.open_shard(DATASET, shard_info(0, data), CountingFetch(data))
    view = shard.data[10:20]
    shard.close()  # the pin goes even though a view still exports the mapping
    assert cache.disk is not None
    assert [e.pins for e in cache.disk.entries()] == [0]
    assert bytes(view) == data[10:20]


def test_eviction_unlinks_a_mapped_file_without_hurting_its_reader(cache_dir: Path) -> None:
    a, b = blob(5, 60_000), blob(6, 60_000)
    cache = ShardCache(cache_dir)
    assert cache.disk is not None
    cache.disk.set_limit(cache.disk.metadata_bytes(least=True) + SLACK + 61_440)
    shard = cache.open_shard(DATASET, shard_info(0, a), CountingFetch(a))
    view = shard.data[1000:5000]
    path = shard.path
    shard.close()
    with cache.open_shard(DATASET, shard_info(1, b), CountingFetch(b)) as other:
        assert bytes(other.data) == b
    assert path is not None
    assert not path.exists()  # evicted (LRU, unpinned)
    assert bytes(view) == a[1000:5000]  # POSIX keeps the mapped pages alive
    view.release()


def test_empty_shard(cache_dir: Path) -> None:
    cache = ShardCache(cache_dir)
    with cache.open_shard(DATASET, shard_info(0, b""), CountingFetch(b"")) as shard:
        assert shard.data.nbytes == 0


def test_ram_mode_verifies_and_keeps_bytes() -> None:
    data = blob(3, 20_000)
    info = shard_info(0, data)
    fetch = CountingFetch(data)
    cache = ShardCache(cache_dir=None, ram_limit="1MB")
    with cache.open_shard(DATASET, info, fetch) as shard:
        assert shard.path is None
        assert bytes(shard.data) == data
    with cache.open_shard(DATASET, info, fetch) as shard:
        assert bytes(shard.data) == data
    assert fetch.calls == 1
    assert cache.ram.stats().hits == 1
    with pytest.raises(CacheError, match="checksum"):
        cache.open_shard(DATASET, shard_info(1, data), CountingFetch(b"y" + data[1:]))


def test_read_small_is_cached_in_ram_and_on_disk(cache_dir: Path) -> None:
    idx = blob(4, 300)
    fetch = CountingFetch(idx)
    cache = ShardCache(cache_dir)
    args = (DATASET, "shard-000000.tar.idx", len(idx), xxh3_128(idx))
    assert cache.read_small(*args, fetch) == idx
    assert cache.read_small(*args, fetch) == idx
    assert ShardCache(cache_dir).read_small(*args, fetch) == idx  # new process-ish: from disk
    assert fetch.calls == 1


def test_prefetch_stages_shards_then_open_hits(cache_dir: Path) -> None:
    blobs = [blob(10 + i, 5000) for i in range(5)]
    infos = [shard_info(i, b) for i, b in enumerate(blobs)]
    fetches = {info.name: CountingFetch(b) for info, b in zip(infos, blobs, strict=True)}

    def fetch_for(info: object) -> CountingFetch:
        return fetches[info.name]  # type: ignore[attr-defined]

    cache = ShardCache(cache_dir, cache_limit="1MB", prefetch_bytes="12KB")
    cache.prefetch(DATASET, infos, fetch_for)
    assert cache.prefetcher is not None
    assert cache.prefetcher.wait_idle(30)
    for info in infos:
        with cache.open_shard(DATASET, info, fetches[info.name]) as s:
            assert bytes(s.data) == blobs[int(info.name[6:12])]
    assert all(f.calls == 1 for f in fetches.values())
    assert cache.stats()["prefetch"].completed == 5
    cache.close()


def test_prefetch_of_cached_shards_starts_no_thread_and_fetches_only_the_rest(
    cache_dir: Path,
) -> None:
    """A warm epoch schedules every shard of its plan: what is cached needs no
    prefetch thread (each thread opens a catalog connection), and threads start only
    for what is left, up to ``prefetch_workers``."""
    blobs = [blob(30 + i, 5000) for i in range(6)]
    infos = [shard_info(i, b) for i, b in enumerate(blobs)]
    fetches = {info.name: CountingFetch(b) for info, b in zip(infos, blobs, strict=True)}

    def fetch_for(info: object) -> CountingFetch:
        return fetches[info.name]  # type: ignore[attr-defined]

    cache = ShardCache(cache_dir, cache_limit="1MB", prefetch_workers=16)
    for info in infos[:4]:
        cache.ensure(DATASET, info, fetch_for(info))
    cache.prefetch(DATASET, infos[:4], fetch_for)
    assert cache.prefetcher is None  # all cached: nothing started
    cache.prefetch(DATASET, infos, fetch_for)
    assert cache.prefetcher is not None
    assert cache.prefetcher.wait_idle(30)
    assert len(cache.prefetcher._threads) == 2  # the two missing shards, not 16
    assert [f.calls for f in fetches.values()] == [1] * 6
    assert cache.stats()["prefetch"].completed == 2
    cache.close()


def test_prefetch_errors_surface_in_the_foreground(cache_dir: Path) -> None:
    data = blob(20, 1000)
    info = shard_info(0, data)
    cache = ShardCache(cache_dir)

    def broken(f: BinaryIO) -> None:
        raise OSError("connection reset")

    cache.prefetch(DATASET, [info], lambda _: broken)
    assert cache.prefetcher is not None
    assert cache.prefetcher.wait_idle(30)
    assert cache.prefetcher.stats().failed == 1
    with pytest.raises(CacheError, match="connection reset"):
        cache.open_shard(DATASET, info, broken)
    cache.close()


def test_from_config_and_dataset_id(cache_dir: Path) -> None:
    cache = ShardCache.from_config(CacheConfig(cache_dir=str(cache_dir), cache_limit=2_000_000))
    assert cache.disk is not None
    assert cache.disk.limit == 2_000_000
    assert dataset_id("s3://bucket/coco/") == dataset_id("s3://bucket/coco")


def test_the_cache_imports_no_storage_torch_or_dali() -> None:
    # the cache layer sits below storage; the CLI may use storage's URL helpers but must
    # start without s3fs, torch or DALI
    code = (
        "import sys, fastload.cache\n"
        "mods = ('torch', 'nvidia.dali', 's3fs', 'fastload.storage')\n"
        "bad = [m for m in mods if m in sys.modules]\n"
        "assert not bad, bad\n"
        "import fastload.cli.cache\n"
        "bad = [m for m in mods[:3] if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(src)}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_prefetch_jobs_are_pruned_and_threads_end_with_an_unclosed_cache(cache_dir: Path) -> None:
    import gc
    import threading
    import weakref

    blobs = [blob(60 + i, 5000) for i in range(6)]
    infos = [shard_info(i, b) for i, b in enumerate(blobs)]
    gate = threading.Event()
    fetches = {info.name: CountingFetch(b) for info, b in zip(infos, blobs, strict=True)}

    def fetch_for(info: object) -> object:
        def fetch(f: BinaryIO) -> None:
            gate.wait(30)
            fetches[info.name](f)  # type: ignore[attr-defined]

        return fetch

    cache = ShardCache(cache_dir, prefetch_workers=1)
    cache.prefetch(DATASET, infos[:4], fetch_for)
    # a new schedule drops what the old one had and no thread took: its jobs go
    cache.prefetch(DATASET, infos[4:], fetch_for)
    prefetcher = cache.prefetcher
    assert prefetcher is not None
    busy = prefetcher.in_flight()
    assert set(cache._prefetch_jobs) <= {cache.key(DATASET, i) for i in infos[4:]} | busy
    gate.set()
    assert prefetcher.wait_idle(30)
    assert cache._prefetch_jobs == {}  # each job is dropped as it starts
    # dropped without close(): the threads do not keep the cache alive, and end
    threads = [t for t in threading.enumerate() if t.name.startswith("fastload-prefetch")]
    assert threads
    cache.prefetch(DATASET, infos, fetch_for)  # cached already: nothing new to run
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is None
    assert prefetcher._stop  # its finaliser stopped the prefetcher: idle threads end now
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
