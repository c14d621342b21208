"""loader.stats(): main-process waits and the dataset's I/O counters summed over workers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastload.loader import DataLoader, LoaderStats
from fastload.loader.stats import WaitRecorder
from fastload.sampling.world import World

from .doubles import ITEM_BYTES, RangeStream, SquaresDataset

SLEEP = 0.02
BATCH = 2


def run(dataset: Any, num_workers: int, epochs: int = 1, **kw: Any) -> DataLoader:
    loader = DataLoader(
        dataset, batch_size=BATCH, num_workers=num_workers, world=World.single(), **kw
    )
    for _ in range(epochs):
        for _batch in loader:
            pass
    return loader


@pytest.mark.parametrize("num_workers", [0, 1])
def test_waits_grow_when_the_dataset_is_slow(num_workers: int) -> None:
    fast = run(SquaresDataset(12), num_workers).stats()
    slow = run(SquaresDataset(12, sleep_s=SLEEP), num_workers).stats()
    assert fast.batches == slow.batches == 6
    assert fast.samples == slow.samples == 12
    # a batch costs BATCH x SLEEP to make and the caller does no work: it waits for
    # (about) all of it; allow half, which no scheduling noise takes away
    margin = 0.5 * BATCH * SLEEP
    assert slow.wait_mean_s - fast.wait_mean_s >= margin
    assert slow.wait_p50_s - fast.wait_p50_s >= margin
    assert slow.wait_total_s >= 6 * margin
    assert slow.wait_max_s >= slow.wait_p95_s >= slow.wait_p50_s > 0
    assert slow.wall_time_s >= slow.wait_total_s
    assert slow.samples_per_s > 0
    assert slow.first_wait_s is not None


def test_io_counters_come_from_the_main_process_without_workers() -> None:
    ds = SquaresDataset(10)
    stats = run(ds, 0).stats()
    assert stats.io == {"cache_hits": 10, "cache_misses": 5, "disk_bytes": 10 * ITEM_BYTES}
    assert stats.bytes_by_tier == {"disk": 10 * ITEM_BYTES}
    assert stats.cache_hit_ratio == pytest.approx(10 / 15)


@pytest.mark.parametrize("persistent", [False, True])
def test_io_counters_are_summed_over_workers_and_epochs(persistent: bool) -> None:
    ds = SquaresDataset(10)
    loader = run(ds, 2, epochs=2, persistent_workers=persistent)
    assert ds.loaded == []  # the main process's copy did no loading
    io = loader.stats().io
    assert io["cache_hits"] == 20
    assert io["disk_bytes"] == 20 * ITEM_BYTES
    assert loader.stats().batches == 10


def test_io_counters_of_a_batched_map_dataset() -> None:
    class Batched(SquaresDataset):
        def __getitems__(self, idx: list[int]) -> list[dict[str, Any]]:
            return [self[i] for i in idx]

    io = run(Batched(9), 2).stats().io
    assert io["cache_hits"] == 9


def test_io_counters_of_an_iterable_dataset_over_workers() -> None:
    ds = RangeStream(11)
    loader = run(ds, 2, epochs=2)
    stats = loader.stats()
    assert stats.io == {"cache_hits": 22, "ram_bytes": 22 * ITEM_BYTES}
    assert stats.bytes_by_tier == {"ram": 22 * ITEM_BYTES}
    assert stats.cache_hit_ratio is None  # no misses counter
    assert stats.samples == 22


def test_stats_serialise_and_start_empty() -> None:
    loader = DataLoader(SquaresDataset(4), batch_size=2, world=World.single())
    empty = loader.stats()
    assert (empty.batches, empty.samples, empty.wait_total_s) == (0, 0, 0.0)
    assert empty.first_wait_s is None
    for _ in loader:
        pass
    data = json.loads(json.dumps(loader.stats().to_dict()))
    assert data["batches"] == 2
    assert data["io"]["cache_hits"] == 4


def test_percentiles_of_recorded_waits() -> None:
    rec = WaitRecorder()
    for w in [0.01] * 19 + [1.0]:
        rec.record(w, 4)
    rec.add_wall(2.0)
    stats = LoaderStats.build(rec, {})
    assert stats.wait_p50_s == pytest.approx(0.01)
    assert stats.wait_max_s == pytest.approx(1.0)
    assert stats.wait_mean_s == pytest.approx((0.19 + 1.0) / 20)
    assert stats.samples_per_s == pytest.approx(40.0)
    assert stats.first_wait_s == pytest.approx(0.01)


def test_finished_worker_generations_release_their_shared_counters() -> None:
    ds = SquaresDataset(6)
    loader = run(ds, 2, epochs=3)
    assert loader._counters == []  # every epoch's workers exited; rows were folded
    assert loader.stats().io["cache_hits"] == 18
    # an epoch left mid-way keeps its generation live (its workers may still run)
    it = iter(loader)
    next(it)
    assert len(loader._counters) == 1
    assert loader.stats().io["cache_hits"] >= 18 + BATCH
