"""The batch transport (fastload.loader.transport): every sample byte-identical through
each transport, worker count, start method, tier and store; batches own their bytes;
one copy of each shard per loader without cache_dir; killed workers leave nothing."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ds_helpers import payload, write_dataset

import fastload
from fastload.errors import ConfigError
from fastload.loader.shared_tier import SHM_DIR
from fastload.loader.transport import RefBatch, collate_refs, stack_images
from fastload.packed import PackedBytes
from gpu.tv_io import needs_torchvision_io

N = 150
# plan_in_workers=True: these tests exercise worker processes, which raw batches
# would otherwise not start (see test_raw_batches_start_no_worker_process)


def _check_batch(batch: dict[str, Any], size: int = 700) -> list[int]:
    """Assert every sample of a packed batch is what was written; return the ids."""
    assert isinstance(batch["__key__"], list)
    assert isinstance(batch["bin"], PackedBytes)
    assert isinstance(batch["cls"], PackedBytes)
    assert len(batch["bin"]) == len(batch["__key__"]) == len(batch["cls"])
    ids = []
    for i, key in enumerate(batch["__key__"]):
        j = int(key[1:])
        assert bytes(batch["bin"][i]) == payload(j, size), key
        assert bytes(batch["cls"][i]) == str(j % 10).encode(), key
        ids.append(j)
    return ids


def _epochs(loader: fastload.DataLoader, epochs: int = 2) -> list[list[int]]:
    out = []
    for _ in range(epochs):
        out.append([j for batch in loader for j in _check_batch(batch)])
    return out


def _assert_two_whole_epochs(ds: Any, loader: fastload.DataLoader) -> None:
    """Each of two epochs of ``loader`` delivers every sample once; then closes it and
    ``ds``."""
    try:
        first, second = _epochs(loader)
        assert sorted(first) == sorted(second) == list(range(N))
    finally:
        loader.close()
        ds.close()


def _shm_entries() -> set[str]:
    """This process's shared tiers in /dev/shm (other jobs on the machine make theirs)."""
    mine = f"fastload-loader-{os.getpid()}-"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


@pytest.fixture
def local_ds(tmp_path: Path) -> str:
    url = f"file://{tmp_path}/ds"
    m = write_dataset(url, n=N, shard_size="16KB")
    assert len(m.shards) > 5
    return url


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache-dir", "cache-dir"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_map_style_every_sample_once_per_epoch(
    local_ds: str, tmp_path: Path, workers: int, cached: bool, shuffle: bool
) -> None:
    before = _shm_entries()
    ds = fastload.ShardedDataset(local_ds, cache_dir=tmp_path / "cache" if cached else None)
    loader = fastload.DataLoader(
        ds, batch_size=16, num_workers=workers, shuffle=shuffle, plan_in_workers=True
    )
    assert loader.transport == "cache"
    try:
        first, second = _epochs(loader)
        assert sorted(first) == sorted(second) == list(range(N))
        if not shuffle:
            assert first == list(range(N))
        elif N > 20:
            assert first != second  # a new permutation each epoch
        stats = loader.io_stats()
        # the bytes were copied once, in this process, out of the cache
        assert stats["disk_bytes"] + stats["ram_bytes"] >= 2 * sum(
            len(payload(j)) for j in range(N)
        )
    finally:
        loader.close()
        ds.close()
    assert _shm_entries() == before


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache-dir", "cache-dir"])
def test_streaming_same_order_as_the_pickle_transport(
    local_ds: str, tmp_path: Path, workers: int, cached: bool
) -> None:
    cache = tmp_path / "cache" if cached else None
    ds = fastload.StreamingDataset(local_ds, shuffle=True, seed=3, cache_dir=cache)
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, plan_in_workers=True)
    ref = fastload.StreamingDataset(local_ds, shuffle=True, seed=3, cache_dir=cache)
    old = fastload.DataLoader(ref, batch_size=8, num_workers=workers, transport="pickle")
    assert (loader.transport, old.transport) == ("cache", "pickle")
    try:
        got = _epochs(loader)
        want = [[int(k[1:]) for batch in old for k in batch["__key__"]] for _ in range(2)]
        assert got == want
        assert sorted(set(got[0])) == list(range(N))
    finally:
        for x in (loader, old, ds, ref):
            x.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_other_start_methods(local_ds: str, tmp_path: Path, method: str) -> None:
    ds = fastload.ShardedDataset(local_ds, cache_dir=tmp_path / "cache")
    ctx = multiprocessing.get_context(method)
    loader = fastload.DataLoader(
        ds,
        batch_size=32,
        num_workers=2,
        shuffle=True,
        multiprocessing_context=ctx,
        plan_in_workers=True,
    )
    try:
        (ids,) = _epochs(loader, 1)
        assert sorted(ids) == list(range(N))
    finally:
        loader.close()
        ds.close()


@pytest.mark.s3
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache-dir", "cache-dir"])
def test_over_seaweedfs(seaweed: Any, tmp_path: Path, cached: bool) -> None:
    url = seaweed.new_url("ds")
    write_dataset(url, n=N, shard_size="16KB", storage_options=seaweed.storage_options)
    ds = fastload.ShardedDataset(
        url,
        cache_dir=tmp_path / "cache" if cached else None,
        storage_options=seaweed.storage_options,
    )
    loader = fastload.DataLoader(
        ds, batch_size=16, num_workers=2, shuffle=True, plan_in_workers=True
    )
    _assert_two_whole_epochs(ds, loader)


@pytest.mark.s3
def test_two_workers_without_cache_dir_fetch_the_dataset_once(
    seaweed: Any, fault_proxy: Any
) -> None:
    url = seaweed.new_url("ds")
    m = write_dataset(url, n=400, shard_size="64KB", storage_options=seaweed.storage_options)
    before = fault_proxy.stats.body_bytes_to_client
    ds = fastload.StreamingDataset(url, shuffle=True, storage_options=fault_proxy.storage_options)
    loader = fastload.DataLoader(ds, batch_size=16, num_workers=2, plan_in_workers=True)
    try:
        ids = [j for batch in loader for j in _check_batch(batch)]
        assert sorted(set(ids)) == list(range(400))
    finally:
        loader.close()
        ds.close()
    wire = fault_proxy.stats.body_bytes_to_client - before
    dataset = m.total_bytes + sum(s.index_bytes for s in m.shards)
    # the manifest is read once by the test's dataset; every shard and index once more
    assert wire <= 1.05 * dataset, (wire, dataset)


def test_batch_kept_past_later_batches_and_evictions_stays_valid(tmp_path: Path) -> None:
    # a cap of a few shards (and the cache's own metadata): later batches evict the
    # shards the first batch came from
    url = f"file://{tmp_path}/big"
    m = write_dataset(url, n=N, shard_size="1MB", size=200_000)
    assert len(m.shards) > 20
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache", cache_limit="8MB")
    loader = fastload.DataLoader(ds, batch_size=16, num_workers=2, plan_in_workers=True)
    try:
        it = iter(loader)
        kept = next(it)
        snapshot = [bytes(b) for b in kept["bin"]]
        for batch in it:
            _check_batch(batch, 200_000)
        ds.source.cache.disk.clear()  # type: ignore[union-attr]
        assert [bytes(b) for b in kept["bin"]] == snapshot
        _check_batch(kept, 200_000)
        evicted = ds.source.cache.disk.counters().evictions  # type: ignore[union-attr]
        assert evicted > 0
    finally:
        loader.close()
        ds.close()


def test_user_collate_gets_samples_as_the_dataset_returns_them(local_ds: str) -> None:
    ds = fastload.ShardedDataset(local_ds)
    seen: list[dict[str, Any]] = []

    def collate(samples: list[dict[str, Any]]) -> int:
        seen.extend(samples)
        return len(samples)

    loader = fastload.DataLoader(
        ds, batch_size=10, num_workers=2, collate_fn=collate, plan_in_workers=True
    )
    try:
        assert loader.transport == "cache"
        assert sum(loader) == N
        assert sorted(seen, key=lambda s: s["__key__"]) == [ds[i] for i in range(N)]
    finally:
        loader.close()
        ds.close()


def _jpeg_shards(tmp_path: Path, n: int = 24) -> str:
    import io

    from PIL import Image

    url = f"file://{tmp_path}/shards"
    rng = np.random.default_rng(0)
    with fastload.ShardWriter(url, shard_size="40KB") as w:
        for i in range(n):
            shape = (48, 64, 3) if i % 2 else (70, 50, 3)
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(buf, "JPEG")
            w.write({"__key__": f"s{i:05d}", "jpg": buf.getvalue(), "cls": i % 3})
    return url


def test_pil_images_arrive_as_a_list(tmp_path: Path) -> None:
    ds = fastload.ShardedDataset(_jpeg_shards(tmp_path, 6), decode="pil")
    loader = fastload.DataLoader(ds, batch_size=3, num_workers=1)
    try:
        batches = list(loader)
        assert [len(b["jpg"]) for b in batches] == [3, 3]
        assert [im.size for im in batches[0]["jpg"]] == [(50, 70), (64, 48), (50, 70)]
        assert batches[0]["cls"].tolist() == [0, 1, 2]
    finally:
        loader.close()
        ds.close()


@pytest.mark.parametrize(
    ("workers", "transport", "ran"),
    [(2, "auto", "pickle"), (0, "auto", "cache"), (2, "cache", "cache")],
    ids=["workers-decode", "threads-no-workers", "threads-asked"],
)
def test_decoded_batches_equal_per_sample_decoding(
    tmp_path: Path, workers: int, transport: str, ran: str
) -> None:
    url = _jpeg_shards(tmp_path)
    ds = fastload.ShardedDataset(url, decode="tensor", size=(32, 40))
    loader = fastload.DataLoader(
        ds, batch_size=5, num_workers=workers, decode_threads=2, transport=transport
    )
    try:
        # with workers, decoding runs in them (measured faster than threads); without,
        # on the loader's threads; batches are the same either way
        assert loader.transport == ran
        got: dict[str, Any] = {}
        for batch in loader:
            images = batch["jpg"]
            assert images.shape[1:] == (3, 32, 40)
            assert images.dtype == torch.uint8
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert isinstance(batch["__key__"], list)
            for i, key in enumerate(batch["__key__"]):
                got[key] = (images[i], int(batch["cls"][i]))
        assert len(got) == len(ds) == 24
        for i in range(len(ds)):
            want = ds[i]
            image, cls = got[want["__key__"]]
            assert torch.equal(image, want["jpg"])
            assert cls == want["cls"]
        if ran == "cache":
            assert loader._builder is not None
            assert loader._builder.stats.decoded == 24
    finally:
        loader.close()
        ds.close()


def test_a_transform_falls_back_to_pickling_unless_asked(local_ds: str) -> None:
    def tf(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "n": len(s["bin"])}

    ds = fastload.ShardedDataset(local_ds, transform=tf)
    assert fastload.DataLoader(ds, batch_size=4).transport == "pickle"
    loader = fastload.DataLoader(ds, batch_size=4, transport="cache", num_workers=1)
    try:
        batch = next(iter(loader))
        assert batch["n"].tolist() == [len(payload(j)) for j in range(4)]
    finally:
        loader.close()
        ds.close()


def test_transport_cache_refuses_datasets_that_make_their_own_items() -> None:
    class Plain(torch.utils.data.Dataset[int]):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> int:
            return i

    with pytest.raises(ConfigError, match="transport='cache'"):
        fastload.DataLoader(Plain(), transport="cache")
    with pytest.raises(ConfigError, match="transport must be one of"):
        fastload.DataLoader(Plain(), transport="shm")
    assert fastload.DataLoader(Plain()).transport == "pickle"


def test_killed_worker_is_a_clear_error_and_leaves_no_shared_memory(local_ds: str) -> None:
    before = _shm_entries()
    ds = fastload.ShardedDataset(local_ds)  # no cache_dir: the loader makes a shared tier
    loader = fastload.DataLoader(
        ds, batch_size=4, num_workers=2, prefetch_factor=1, plan_in_workers=True
    )
    assert loader._shared_dir is not None
    assert os.path.isdir(loader._shared_dir)
    shared = loader._shared_dir
    it = iter(loader)
    _check_batch(next(it))
    pids = [p.pid for p in multiprocessing.active_children()]
    assert pids, "the loader's workers should be running"
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"(?i)worker.*(killed|exited|signal)"):
        list(it)
    del it
    gc.collect()
    loader.close()
    ds.close()
    assert not os.path.exists(shared)
    assert _shm_entries() == before


def test_shared_tier_is_removed_when_the_loader_is_collected(local_ds: str) -> None:
    ds = fastload.ShardedDataset(local_ds)
    loader = fastload.DataLoader(ds, batch_size=50, num_workers=1, plan_in_workers=True)
    shared = loader._shared_dir
    assert shared is not None
    assert sum(len(b["__key__"]) for b in loader) == N
    ds.close()
    del loader
    gc.collect()
    assert not os.path.exists(shared)


def test_collate_refs_and_packed_bytes() -> None:
    from fastload.datasets.source import SampleRef

    refs = [
        SampleRef("a", 0, (("jpg", 10, 3), ("cls", 13, 1))),
        SampleRef("b", 2, (("cls", 40, 2),)),
    ]
    rb = collate_refs(refs)
    assert isinstance(rb, RefBatch)
    assert len(rb) == 2
    assert rb.fields == ("jpg", "cls")
    assert rb.shards.tolist() == [0, 2]
    assert rb.spans.tolist() == [[[10, 3], [13, 1]], [[-1, -1], [40, 2]]]
    assert rb.nbytes == 6
    with pytest.raises(TypeError, match="SampleRef"):
        collate_refs([{"__key__": "x"}])  # type: ignore[list-item]

    p = PackedBytes.from_list([b"abc", None, b"", b"\x00\xff"])
    assert len(p) == 4
    assert p.missing == (1,)
    assert p.nbytes == 5
    assert [bytes(x) for x in p] == [b"abc", b"", b"", b"\x00\xff"] == p.tolist()
    assert p.sizes.tolist() == [3, 0, 0, 2]
    assert bytes(p[-1]) == b"\x00\xff"
    with pytest.raises(IndexError):
        p[4]
    assert [t.tolist() for t in p.tensors()] == [[97, 98, 99], [], [], [0, 255]]
    import pickle

    assert pickle.loads(pickle.dumps(p)) == p


def test_stack_images_channels_last_and_a_clear_error_on_mixed_sizes() -> None:
    hwc = [np.full((4, 5, 3), k, np.uint8) for k in range(3)]
    chw = [torch.from_numpy(a).permute(2, 0, 1) for a in hwc]
    out = stack_images(chw)
    assert out.shape == (3, 3, 4, 5)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(out[k], chw[k]) for k in range(3))
    with pytest.raises(ConfigError, match=r"different sizes.*size=\(height, width\)"):
        stack_images([chw[0], torch.zeros(3, 4, 6, dtype=torch.uint8)])


def test_slab_pool_recycles_only_what_nothing_refers_to() -> None:
    from fastload.loader.slabs import SlabPool

    pool = SlabPool(max_free_bytes=8 * 2**20)
    t = pool.tensor(3 * 2**20)
    t.fill_(7)
    view = t.numpy()[100:200]  # a numpy view derived from the batch keeps its slab
    sub = t[5:10]
    del t
    gc.collect()
    other = pool.tensor(3 * 2**20)
    other.fill_(9)
    assert pool.stats().reuses == 0
    assert int(view.sum()) == 700
    assert sub.tolist() == [7] * 5
    del view, sub
    gc.collect()
    again = pool.tensor(3 * 2**20 - 5)
    st = pool.stats()
    assert (st.allocations, st.reuses, st.in_use) == (2, 1, 2)
    del other, again
    gc.collect()
    st = pool.stats()
    assert (st.in_use, st.free) == (0, 2)
    pool.tensor(20 * 2**20)  # larger than any idle slab: a new one; idle set stays bounded
    gc.collect()
    st = pool.stats()
    assert (st.allocations, st.dropped, st.free) == (3, 3, 0)


def test_a_slab_the_collector_gives_back_inside_the_pools_lock_does_not_deadlock() -> None:
    # a batch held by a reference cycle is freed by a garbage collection, which may
    # run during any allocation, also one inside the pool's lock (while _take looks
    # for a slab): its finalizer must not wait for that lock
    from fastload.loader.slabs import SlabPool

    pool = SlabPool()
    batch = pool.tensor(2**20)
    cycle: list[Any] = [batch]
    cycle.append(cycle)
    del batch, cycle

    def collect_inside_the_lock() -> None:
        with pool._lock:
            gc.collect()

    t = threading.Thread(target=collect_inside_the_lock, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the slab's finalizer waited for the lock its collection held"
    st = pool.stats()
    assert (st.in_use, st.free) == (0, 1)
    pool.tensor(2**20)
    assert pool.stats().reuses == 1


def _pool_in_child(queue: Any) -> None:
    from fastload.loader.slabs import shared_pool

    queue.put((os.getpid(), shared_pool().stats().allocations))


def test_the_loaders_of_a_process_share_its_batch_slabs(local_ds: str, tmp_path: Path) -> None:
    """A loader made per epoch fills the slabs the last one let go (fresh pages cost
    more than the copy into them); a forked child starts a pool of its own."""
    from fastload.loader.slabs import shared_pool
    from fastload.loader.transport import BatchBuilder

    ds = fastload.ShardedDataset(local_ds, cache_dir=tmp_path / "cache")
    try:
        rb = collate_refs([ds.source.ref(i) for i in range(0, N, 7)])
        first = BatchBuilder(ds.source)
        batch = first.build(rb)
        assert _check_batch(batch) == list(range(0, N, 7))
        del batch
        gc.collect()  # the batch is dropped: its slabs go back to the pool
        before = shared_pool().stats()
        second = BatchBuilder(ds.source)  # e.g. the next epoch's loader
        assert second.slabs is first.slabs is shared_pool()
        batch = second.build(rb)
        assert _check_batch(batch) == list(range(0, N, 7))
        after = shared_pool().stats()
        assert after.allocations == before.allocations  # none: both fields reused slabs
        assert after.reuses == before.reuses + 2
        del batch
    finally:
        ds.close()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_pool_in_child, args=(queue,))
    child.start()
    pid, allocations = queue.get(timeout=60)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert pid != os.getpid()
    assert shared_pool().stats().allocations > 0  # the parent's pool had made slabs
    assert allocations == 0  # the child's is a pool of its own, not the parent's copy


@pytest.mark.parametrize("cached", [False, True], ids=["ram", "disk"])
def test_a_shuffled_epoch_reopens_shards_for_under_5_percent_of_reads(
    tmp_path: Path, cached: bool
) -> None:
    url = f"file://{tmp_path}/ds"
    m = write_dataset(url, n=600, shard_size="16KB")
    assert len(m.shards) >= 20
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "cache" if cached else None)
    try:
        order = np.random.default_rng(0).permutation(len(ds)).tolist()
        for i in order:
            assert ds[i]["bin"] == payload(i)
        reopens = ds.source.shard_opens - len(m.shards)
        assert reopens <= 0.05 * len(order), (ds.source.shard_opens, ds.source.max_open_shards)
    finally:
        ds.close()


def test_open_shards_are_bounded_by_the_cap(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ds"
    m = write_dataset(url, n=600, shard_size="16KB")
    largest = max(s.bytes for s in m.shards)
    ds = fastload.ShardedDataset(url, cache_dir=tmp_path / "c", cache_limit=12 * largest)
    assert ds.source.max_open_shards == 3  # a quarter of what fits: other processes pin too
    assert fastload.ShardedDataset(url, max_open_shards=7).source.max_open_shards == 7


def test_nvjpeg_decode_option(tmp_path: Path) -> None:
    url = _jpeg_shards(tmp_path, 6)
    ds = fastload.ShardedDataset(url, decode="nvjpeg", size=(32, 40))
    # per sample (and under torch's own DataLoader) the CPU decoder gives the outputs
    one = ds[0]
    assert one["jpg"].shape == (3, 32, 40)
    cpu = fastload.ShardedDataset(url, decode="tensor", size=(32, 40))
    assert torch.equal(one["jpg"], cpu[0]["jpg"])
    loader = fastload.DataLoader(ds, batch_size=3)
    assert loader.transport == "cache"
    assert loader._builder is not None
    assert loader._builder.batch_decoder is not None  # whole batches, on the loader's device
    assert loader._builder.decoder is None


@needs_torchvision_io
def test_nvjpeg_batches_through_the_loader(tmp_path: Path) -> None:
    url = _jpeg_shards(tmp_path, 6)
    ds = fastload.ShardedDataset(url, decode="nvjpeg", size=(32, 40))
    loader = fastload.DataLoader(ds, batch_size=3, num_workers=1)
    try:
        for batch in loader:
            assert batch["jpg"].shape == (3, 3, 32, 40)
            assert batch["jpg"].dtype == torch.uint8
    finally:
        loader.close()
        ds.close()


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_resume_mid_epoch_through_the_cache_transport(local_ds: str, kind: str) -> None:
    def make() -> tuple[Any, fastload.DataLoader]:
        if kind == "map":
            ds: Any = fastload.ShardedDataset(local_ds)
            return ds, fastload.DataLoader(
                ds, batch_size=8, num_workers=2, shuffle=True, plan_in_workers=True
            )
        ds = fastload.StreamingDataset(local_ds, shuffle=True, seed=1)
        return ds, fastload.DataLoader(ds, batch_size=8, num_workers=2, plan_in_workers=True)

    ds, loader = make()
    try:
        (whole,) = _epochs(loader, 1)  # the uninterrupted epoch
    finally:
        loader.close()
        ds.close()
    ds, loader = make()
    seen: list[int] = []
    for step, batch in enumerate(loader):
        seen += _check_batch(batch)
        if step == 6:
            break
    state = loader.state_dict()
    loader.close()
    ds.close()
    ds, loader = make()
    try:
        loader.load_state_dict(state)
        seen += [j for batch in loader for j in _check_batch(batch)]
    finally:
        loader.close()
        ds.close()
    assert seen == whole
    assert set(seen) == set(range(N))


def test_persistent_workers_and_a_cpu_device(local_ds: str, tmp_path: Path) -> None:
    ds = fastload.ShardedDataset(local_ds, cache_dir=tmp_path / "cache")
    loader = fastload.DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        persistent_workers=True,
        device="cpu",
        shuffle=True,
        plan_in_workers=True,
    )
    _assert_two_whole_epochs(ds, loader)


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_raw_batches_start_no_worker_process(local_ds: str, tmp_path: Path, kind: str) -> None:
    # the default for raw batches: planned and built by the loader's builder thread,
    # whatever num_workers says (measured faster); decoding keeps its workers
    ds: Any = (
        fastload.ShardedDataset(local_ds, cache_dir=tmp_path / "c")
        if kind == "map"
        else fastload.StreamingDataset(local_ds, cache_dir=tmp_path / "c")
    )
    kw = {"shuffle": True} if kind == "map" else {}
    loader = fastload.DataLoader(
        ds, batch_size=16, num_workers=2, prefetch_factor=4, persistent_workers=True, **kw
    )
    try:
        assert (loader.transport, loader.worker_processes) == ("cache", 0)
        first, second = _epochs(loader)
        assert sorted(set(first)) == sorted(set(second)) == list(range(N))
        assert not multiprocessing.active_children()
    finally:
        loader.close()
        ds.close()
    decoding = fastload.ShardedDataset(_jpeg_shards(tmp_path, 4), decode="tensor", size=8)
    assert fastload.DataLoader(decoding, num_workers=2).worker_processes == 2


def test_shared_tiers_are_swept_by_lease_not_by_pid(tmp_path: Path) -> None:
    import subprocess
    import sys

    from fastload.loader.shared_tier import make_shared_tier_dir, sweep_stale

    base = tmp_path / "shm"
    base.mkdir()
    # a tier left behind under a PID that is alive (ours: PIDs repeat across
    # containers) but whose lease nobody holds: its owner is gone, it goes
    left = base / f"fastload-loader-{os.getpid()}-left"
    left.mkdir()
    (left / ".lease").touch()
    (left / "data").write_bytes(b"x")
    # a tier whose lease a live process holds (under a PID that no longer exists)
    held = base / "fastload-loader-999999999-held"
    held.mkdir()
    (held / ".lease").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(held / ".lease"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        assert sweep_stale(str(base)) == 1
        assert not left.exists()
        assert held.exists()
    finally:
        holder.communicate("")
    assert sweep_stale(str(base)) == 1  # its holder is gone now
    assert not held.exists()
    # a loader's own tier holds its lease until it is removed
    path, lease = make_shared_tier_dir(0)
    try:
        sweep_stale(os.path.dirname(path))  # (other, stale tiers there may go)
        assert os.path.exists(path)
    finally:
        from fastload.loader.shared_tier import remove_shared_tier_dir

        remove_shared_tier_dir(path, os.getpid(), lease)
    assert not os.path.exists(path)


def test_worker_settings_without_worker_processes_warn(local_ds: str) -> None:
    """Raw batches start no worker process: a worker_init_fn that would never run is
    said, not silently dropped; plan_in_workers=True starts the workers and runs it."""
    ds = fastload.ShardedDataset(local_ds)
    with pytest.warns(UserWarning, match="worker_init_fn unused"):
        loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, worker_init_fn=_noop_init)
    assert loader.worker_processes == 0
    loader.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = fastload.DataLoader(
            ds, batch_size=8, num_workers=2, worker_init_fn=_noop_init, plan_in_workers=True
        )
    assert kept.worker_processes == 2
    assert sum(len(b["__key__"]) for b in kept) == len(ds)
    kept.close()
    ds.close()


def _noop_init(worker_id: int) -> None:
    del worker_id
