"""StreamingDataset: the epoch plan for each rank and worker, read through the cache."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data
from ds_helpers import index_of, payload, write_dataset

from fastload.datasets.streaming import StreamingDataset
from fastload.sampling import World
from support.resume import elastic_resume_in_epoch_1


def _keys(ds: StreamingDataset) -> list[int]:
    return [index_of(s) for s in ds]


def test_one_process_sees_everything_once_and_right(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=100)
    ds = StreamingDataset(str(tmp_path / "ds"), seed=3, world=World.single())
    samples = list(ds)
    order = [index_of(s) for s in samples]
    assert sorted(order) == list(range(100))
    assert order != list(range(100))  # shuffled
    for s in samples:
        i = index_of(s)
        assert s["bin"] == payload(i)
    assert _keys(ds) == order  # same epoch, same order
    ds.set_epoch(1)
    assert _keys(ds) != order
    assert list(ds.rank_plan()) == _keys(ds)


def test_no_shuffle_is_manifest_order(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=30)
    ds = StreamingDataset(str(tmp_path / "ds"), shuffle=False, world=World.single())
    assert _keys(ds) == list(range(30))


@pytest.mark.parametrize("drop_last", [False, True])
def test_virtual_world_partition(tmp_path: Path, drop_last: bool) -> None:
    m = write_dataset(str(tmp_path / "ds"), n=203)
    seen: Counter[int] = Counter()
    counts = []
    shards_per_node: dict[int, set[int]] = {0: set(), 1: set()}
    for world in World.every_rank(num_nodes=2, ranks_per_node=2):
        ds = StreamingDataset(str(tmp_path / "ds"), seed=1, world=world, drop_last=drop_last)
        ds.configure(batch_size=5, drop_last=drop_last, samples_consumed=0)
        keys = _keys(ds)
        assert len(keys) == len(ds)
        counts.append(len(keys))
        seen.update(keys)
        for k in keys:
            shards_per_node[world.node].add(m.locate(k)[0])
    assert len(set(counts)) == 1  # equal share per rank: DDP does not hang
    if drop_last:
        assert max(seen.values()) == 1
        assert sum(counts) == 200
    else:
        assert set(seen) == set(range(203))
        assert sum(counts) >= 203
    # each node reads about half of the shards
    assert len(shards_per_node[0] & shards_per_node[1]) <= 2


def _collate(batch: list[Any]) -> list[int]:
    return [index_of(s) for s in batch]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_torch_dataloader_workers_reproduce_the_rank_order(tmp_path: Path, workers: int) -> None:
    write_dataset(str(tmp_path / "ds"), n=97)
    ds = StreamingDataset(
        str(tmp_path / "ds"), seed=5, world=World.single(), cache_dir=tmp_path / "cache"
    )
    ds.configure(batch_size=4, drop_last=False, samples_consumed=0)
    expected = list(ds.rank_plan())
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=_collate)
    got = [k for b in loader for k in b]
    assert got == expected
    assert sorted(set(got)) == list(range(97))


def test_resume_mid_epoch_continues_the_suffix(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=64)
    ds = StreamingDataset(str(tmp_path / "ds"), seed=2, world=World.single())
    ds.configure(batch_size=8, drop_last=False, samples_consumed=0)
    full = _keys(ds)
    ds.configure(batch_size=8, drop_last=False, samples_consumed=24)
    assert _keys(ds) == full[24:]


def test_prefetch_stages_upcoming_shards(tmp_path: Path) -> None:
    m = write_dataset(str(tmp_path / "ds"), n=150)
    ds = StreamingDataset(
        str(tmp_path / "ds"),
        seed=0,
        world=World.single(),
        cache_dir=tmp_path / "cache",
        prefetch_shards=2,
    )
    assert sorted(_keys(ds)) == list(range(150))
    pf = ds.source.cache.prefetcher
    assert pf is not None
    assert pf.stats().completed > 0
    # one store for the prefetch threads and the reader: every byte fetched is counted,
    # each shard and index exactly once
    assert ds.io_stats()["remote_bytes"] == m.total_bytes + sum(s.index_bytes for s in m.shards)
    # prefetch is scheduled when the worker first reaches a shard, not at every switch
    assert pf.stats().scheduled <= 2 * len(m.shards)
    ds.close()
    assert np.sum([s.samples for s in m.shards]) == 150


@pytest.mark.parametrize(
    ("world_size", "drop_last"), [(1, False), (1, True), (3, False), (3, True)]
)
def test_fastload_loader_len_matches_the_batches(
    tmp_path: Path, world_size: int, drop_last: bool
) -> None:
    import fastload

    write_dataset(str(tmp_path / "ds"), n=100)
    world = World.of(0, world_size)
    ds = StreamingDataset(str(tmp_path / "ds"), world=world)
    loader = fastload.DataLoader(ds, batch_size=8, drop_last=drop_last, world=world)
    batches = list(loader)
    assert len(loader) == len(batches)
    sizes = [len(b["__key__"]) for b in batches]
    if drop_last:
        assert set(sizes) == {8}  # the tail dropped: full batches
    else:
        # full batches, then one short one padded only to equal ranks (issue 12)
        assert set(sizes[:-1]) == {8}
        assert sum(sizes) == -(-100 // world_size)


@pytest.mark.parametrize("transport", ["cache", "pickle"])
def test_an_elastic_resume_in_a_later_epoch_keeps_the_saved_layout(
    tmp_path: Path, transport: str
) -> None:
    """Saved mid-epoch 1 on 2 nodes, loaded into fresh loaders (still at epoch 0) on 1
    node: the rest of epoch 1 is every sample not yet seen, once. Before the loader
    state carried the epoch, the fresh loaders' set_epoch(1) chose a new layout and
    repeated 18 samples and lost 18 of 400."""
    import fastload

    url = f"file://{tmp_path}/ds"
    write_dataset(url, n=400, shard_size="8KB")

    def loaders(worlds: list[World]) -> list[fastload.DataLoader]:
        out = []
        for w in worlds:
            ds = StreamingDataset(url, shuffle=True, seed=3, world=w, drop_last=True)
            out.append(fastload.DataLoader(ds, batch_size=4, world=w, drop_last=True,
                                           transport=transport))  # fmt: skip
        return out

    def keys(batches: Any) -> list[str]:
        return [k for b in batches for k in b["__key__"]]

    before, after, state = elastic_resume_in_epoch_1(loaders, keys)
    assert (state["epoch"], state["dataset"]["epoch"], state["dataset"]["canonical_nodes"]) == (
        1,
        1,
        2,
    )
    assert len(before) + len(after) == 400 // 8 * 8
    assert len(set(before + after)) == len(before) + len(after)  # none twice, none lost
