"""Exact resume: run k batches, save, resume in a new loader, compare with an
uninterrupted run; over map-style and iterable datasets and 0, 1, 2 workers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from fastload.errors import ConfigError
from fastload.loader import DataLoader
from fastload.sampling.world import World

from .doubles import OpaqueStream, PlainDataset, RangeStream, SquaresDataset, indices

N = 23
BATCH = 4

LoaderFactory = Callable[[], DataLoader]


def make(kind: str, num_workers: int, **kw: Any) -> LoaderFactory:
    rank = kw.pop("rank", 0)
    world_size = kw.pop("world_size", 1)
    n = kw.pop("n", N)
    batch = kw.pop("batch_size", BATCH)

    def factory() -> DataLoader:
        world = World.of(rank, world_size)
        if kind == "map":
            return DataLoader(
                SquaresDataset(n),
                batch_size=batch,
                shuffle=True,
                seed=7,
                num_workers=num_workers,
                world=world,
                **kw,
            )
        ds = RangeStream(n, seed=7, rank=rank, world_size=world_size)
        return DataLoader(ds, batch_size=batch, num_workers=num_workers, world=world, **kw)

    return factory


def run_epoch(loader: DataLoader) -> list[list[int]]:
    return [indices(b) for b in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def assert_resumes(factory: LoaderFactory, k: int, epochs_before: int = 0) -> None:
    """The reusable check: an uninterrupted run equals k batches + save + resume."""
    reference = factory()
    for _ in range(epochs_before):
        run_epoch(reference)
    full = run_epoch(reference)

    first = factory()
    for _ in range(epochs_before):
        run_epoch(first)
    it = iter(first)
    head = [indices(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    del it

    second = factory()
    second.load_state_dict(state)
    rest = run_epoch(second)
    assert head == full[:k]
    assert rest == full[k:]
    assert second.state_dict()["epoch"] == epochs_before + 1
    assert second.state_dict()["batches_consumed"] == 0


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_resume_mid_epoch_matches_uninterrupted_run(kind: str, num_workers: int) -> None:
    factory = make(kind, num_workers)
    assert len(factory()) == 6
    for k in (1, 4):
        assert_resumes(factory, k)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_resume_in_a_later_epoch(kind: str) -> None:
    assert_resumes(make(kind, 2), 3, epochs_before=1)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_resume_with_persistent_workers(kind: str) -> None:
    factory = make(kind, 2, persistent_workers=True)
    assert_resumes(factory, 2, epochs_before=1)


def test_resume_with_drop_last() -> None:
    assert_resumes(make("map", 1, drop_last=True), 2)
    loader = make("map", 0, drop_last=True)()
    assert len(loader) == N // BATCH
    assert all(len(b) == BATCH for b in run_epoch(loader))


def test_state_counts_consumed_batches_not_prefetched() -> None:
    loader = make("map", 2, prefetch_factor=4)()
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    assert state["batches_consumed"] == 2
    assert state["epoch"] == 0
    assert state["global_batch_size"] == BATCH
    assert state["version"] == 1


def test_completed_epoch_points_at_next_epoch() -> None:
    loader = make("map", 0)()
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    # the last batch was handed over; StopIteration has not been seen yet
    assert loader.state_dict()["epoch"] == 1
    assert loader.state_dict()["batches_consumed"] == 0
    with pytest.raises(StopIteration):
        next(it)
    assert loader.epoch == 1
    assert loader.batches_consumed == 0


def test_new_epochs_reshuffle_and_set_epoch_restarts_or_keeps() -> None:
    loader = make("map", 0)()
    e0 = run_epoch(loader)
    e1 = run_epoch(loader)  # the loader moved on to epoch 1 by itself
    assert e0 != e1
    assert sorted(flat(e0)) == sorted(flat(e1)) == list(range(N))
    loader.set_epoch(0)
    assert run_epoch(loader) == e0
    # set_epoch to the current epoch keeps the resume point
    it = iter(loader)
    first = indices(next(it))
    loader.set_epoch(1)
    rest = run_epoch(loader)
    assert [first, *rest] == e1


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("persistent", [False, True])
def test_break_then_iterate_continues_the_epoch(kind: str, persistent: bool) -> None:
    loader = make(kind, 2, persistent_workers=persistent)()
    full = run_epoch(make(kind, 0)())
    got = []
    for b in loader:
        got.append(indices(b))
        if len(got) == 2:
            break
    got += run_epoch(loader)
    assert got == full


def test_new_iterator_supersedes_the_old_one() -> None:
    loader = make("map", 0)()
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


def test_resumed_map_loader_does_not_load_consumed_samples() -> None:
    ds = SquaresDataset(N)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, world=World.single())
    loader.load_state_dict({**loader.state_dict(), "batches_consumed": 3})
    rest = flat(run_epoch(loader))
    assert sorted(ds.loaded) == sorted(rest)
    assert len(ds.loaded) == N - 3 * BATCH


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_partition_the_epoch_with_equal_batch_counts(drop_last: bool) -> None:
    world_size, n = 3, 20
    per_rank = []
    states = []
    for rank in range(world_size):
        loader = make("map", 0, rank=rank, world_size=world_size, n=n, drop_last=drop_last)()
        batches = run_epoch(loader)
        per_rank.append(batches)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts: DDP does not hang
    seen = sorted(i for batches in per_rank for b in batches for i in b)
    if drop_last:
        # the partition drops the tail, then the incomplete last batch is dropped
        assert len(seen) == len(set(seen)) == (n // world_size) // BATCH * BATCH * world_size
    else:
        assert set(seen) == set(range(n))
        assert len(seen) == -(-n // world_size) * world_size  # padded by wrapping around
    assert all(s == states[0] for s in states)  # identical on every rank


def test_resume_onto_a_different_world_with_the_same_global_batch() -> None:
    n = 40
    two = [make("map", 0, rank=r, world_size=2, n=n, batch_size=4)() for r in range(2)]
    its = [iter(lo) for lo in two]
    consumed = {i for it in its for _ in range(2) for i in indices(next(it))}
    state = two[0].state_dict()
    assert state == two[1].state_dict()
    four = [make("map", 0, rank=r, world_size=4, n=n, batch_size=2)() for r in range(4)]
    rest: list[int] = []
    for lo in four:
        lo.load_state_dict(state)
        rest += flat(run_epoch(lo))
    assert len(consumed) == 16
    assert sorted(rest) == sorted(set(range(n)) - consumed)


def test_load_state_rejects_a_different_global_batch_size() -> None:
    state = make("map", 0)().state_dict()
    other = make("map", 0, batch_size=BATCH * 2)()
    with pytest.raises(ConfigError, match=r"global batch size 4 .* this loader's is 8"):
        other.load_state_dict(state)


def test_load_state_rejects_a_different_dataset_length() -> None:
    state = make("map", 0)().state_dict()
    with pytest.raises(ConfigError, match=r"dataset length 23; this loader has 24"):
        make("map", 0, n=N + 1)().load_state_dict(state)


def test_load_state_rejects_other_seed_version_and_bad_counts() -> None:
    loader = make("map", 0)()
    state = loader.state_dict()
    with pytest.raises(ConfigError, match="seed 8"):
        loader.load_state_dict({**state, "seed": 8})
    with pytest.raises(ConfigError, match="version 2"):
        loader.load_state_dict({**state, "version": 2})
    with pytest.raises(ConfigError, match="only 6"):
        loader.load_state_dict({**state, "batches_consumed": 7})
    with pytest.raises(ConfigError, match="missing"):
        loader.load_state_dict({"version": 1})


def test_iterable_dataset_state_is_checked_by_the_dataset() -> None:
    state = make("iterable", 0)().state_dict()
    assert state["dataset"] == {"seed": 7, "n": N}
    loader = DataLoader(RangeStream(N, seed=8), batch_size=BATCH, world=World.single())
    with pytest.raises(ConfigError, match="RangeStream state"):
        loader.load_state_dict(state)


def test_non_resumable_iterable_cannot_resume_mid_epoch() -> None:
    loader = DataLoader(OpaqueStream(10), batch_size=2, world=World.single())
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    with pytest.raises(ConfigError, match="ResumableIterable"):
        loader.load_state_dict({**loader.state_dict(), "batches_consumed": 1})


def test_arguments_the_loader_owns_are_rejected() -> None:
    ds = PlainDataset(4)
    with pytest.raises(ConfigError, match="sampler is mutually exclusive with shuffle"):
        DataLoader(ds, sampler=[0, 1], shuffle=True, world=World.single())
    with pytest.raises(ConfigError, match="in_order"):
        DataLoader(ds, in_order=False, world=World.single())
    with pytest.raises(ConfigError, match="iterable dataset orders itself"):
        DataLoader(RangeStream(4), shuffle=True, world=World.single())
    with pytest.raises(ConfigError, match="batch_size"):
        DataLoader(ds, batch_size=0, world=World.single())


def test_default_world_is_detected_and_plain_datasets_work() -> None:
    loader = DataLoader(PlainDataset(5), batch_size=2)
    assert loader.layout.world_size == 1
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert loader.stats().io == {}


def test_an_empty_dataset_yields_nothing_and_moves_one_epoch_per_pass() -> None:
    loader = DataLoader(PlainDataset(0), batch_size=2, world=World.single())
    assert len(loader) == 0
    assert list(loader) == []
    assert loader.state_dict()["epoch"] == 1
    assert list(loader) == []
    assert loader.state_dict()["epoch"] == 2


class FailingAt(SquaresDataset):
    """Raises on one index: a corrupt sample mid-epoch."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return super().__getitem__(i)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_sample_mid_epoch_raises_and_leaves_the_state_exact(num_workers: int) -> None:
    n = 24  # unshuffled: sample 13 is in batch 3
    loader = DataLoader(
        FailingAt(n, bad=13), batch_size=BATCH, num_workers=num_workers, world=World.single()
    )
    it = iter(loader)
    got = [indices(next(it)) for _ in range(3)]
    with pytest.raises(ValueError, match="sample 13 is corrupt"):
        next(it)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    state = loader.state_dict()
    assert (state["epoch"], state["batches_consumed"]) == (0, 3)
    fixed = DataLoader(SquaresDataset(n), batch_size=BATCH, world=World.single())
    fixed.load_state_dict(state)
    assert run_epoch(fixed)[0] == [12, 13, 14, 15]
