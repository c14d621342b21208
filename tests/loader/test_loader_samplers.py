"""fastload.DataLoader takes torch's ``sampler=`` and ``batch_sampler=`` (torchvision's
recipes pass a GroupedBatchSampler, a DistributedSampler, a repeated-augmentation
sampler): the same batches as torch's DataLoader, torch's argument rules, samples
counted by the sampler, and resume (exact for a deterministic sampler, refused with a
clear error for one that is not)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.data

from fastload.errors import ConfigError
from fastload.loader import DataLoader
from fastload.sampling.world import World

from .doubles import RangeStream, SquaresDataset, indices
from .reference_samplers import GroupedBatchSampler, RepeatAugSampler

N = 40
GROUPS = [(i * 7) % 3 for i in range(N)]  # three aspect-ratio groups


def grouped(seed: int = 5, batch: int = 4) -> GroupedBatchSampler:
    base = torch.utils.data.DistributedSampler(
        range(N), num_replicas=1, rank=0, shuffle=True, seed=seed
    )
    return GroupedBatchSampler(base, GROUPS, batch)


Factory = Callable[[], DataLoader]


def run(loader: DataLoader) -> list[list[int]]:
    return [indices(b) for b in loader]


def drive(loader: DataLoader, epoch: int) -> None:
    """What torchvision's references do before each epoch: ``sampler.set_epoch``."""
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


def resume_check(factory: Factory, k: int, epochs_before: int = 0) -> None:
    """k batches, a state through JSON, a new loader (its sampler at epoch 0: the state
    sets it back): the uninterrupted run's batches."""
    reference = factory()
    for e in range(epochs_before):
        drive(reference, e)
        run(reference)
    drive(reference, epochs_before)
    full = run(reference)
    first = factory()
    for e in range(epochs_before):
        drive(first, e)
        run(first)
    drive(first, epochs_before)
    it = iter(first)
    head = [indices(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    second = factory()
    second.load_state_dict(state)
    rest = run(second)
    assert head == full[:k]
    assert rest == full[k:]
    assert second.epoch == epochs_before + 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_grouped_batch_sampler_gives_torchs_batches(num_workers: int) -> None:
    ours = DataLoader(SquaresDataset(N), batch_sampler=grouped(), num_workers=num_workers)
    theirs = torch.utils.data.DataLoader(SquaresDataset(N), batch_sampler=grouped())
    assert isinstance(theirs.batch_sampler, GroupedBatchSampler)
    base = theirs.batch_sampler.sampler
    assert isinstance(base, torch.utils.data.DistributedSampler)
    epochs = []
    for epoch in range(3):
        if epoch < 2:
            ours.sampler.set_epoch(epoch)  # as the reference drives it
        else:
            ours.set_epoch(epoch)  # the loader passes it on
            assert ours.sampler.epoch == 2
        base.set_epoch(epoch)
        mine = run(ours)
        assert mine == [indices(b) for b in theirs]
        assert all(len({GROUPS[i] for i in b}) == 1 for b in mine)  # one group a batch
        epochs.append(mine)
    assert epochs[0] != epochs[1] != epochs[2]
    # as torch's, iterating never calls set_epoch: without it an epoch repeats
    assert run(ours) == epochs[2]
    assert len(ours) == N // 4
    assert ours.batch_size is None  # as torch's under a batch_sampler
    assert isinstance(ours.batch_sampler, GroupedBatchSampler)
    assert isinstance(ours.sampler, torch.utils.data.DistributedSampler)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_with_a_grouped_batch_sampler_is_exact(num_workers: int) -> None:
    def factory() -> DataLoader:
        return DataLoader(SquaresDataset(N), batch_sampler=grouped(), num_workers=num_workers)

    for k in (1, 6):
        resume_check(factory, k)
    resume_check(factory, 3, epochs_before=1)


def test_a_distributed_sampler_splits_and_resumes_exactly() -> None:
    def factory(rank: int) -> Factory:
        def make() -> DataLoader:
            sampler = torch.utils.data.DistributedSampler(
                range(N), num_replicas=2, rank=rank, shuffle=True, seed=3
            )
            return DataLoader(
                SquaresDataset(N), batch_size=3, sampler=sampler, num_workers=1,
                world=World.of(rank, 2), persistent_workers=True,
            )  # fmt: skip

        return make

    ranks = [run(factory(r)()) for r in (0, 1)]
    assert sorted(i for b in ranks[0] + ranks[1] for i in b) == list(range(N))
    assert [len(b) for b in ranks[0]] == [3] * 6 + [2]
    for rank in (0, 1):
        resume_check(factory(rank), 4, epochs_before=1)


def test_a_repeated_augmentation_sampler_resumes_exactly() -> None:
    def factory() -> DataLoader:
        sampler = RepeatAugSampler(N, num_replicas=2, rank=1, seed=9, repetitions=3)
        return DataLoader(SquaresDataset(N), batch_size=4, sampler=sampler, drop_last=True)

    full = run(factory())
    flat = [i for b in full for i in b]
    assert len(flat) == 20
    assert len(set(flat)) < len(flat)  # repetitions on this rank
    resume_check(factory, 2)
    resume_check(factory, 3, epochs_before=1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_unseeded_sampler_continues_in_process_but_refuses_a_state(num_workers: int) -> None:
    """The documented limitation: ``RandomSampler()`` draws from torch's global RNG, so
    a new process's epoch differs. A break and a new ``iter()`` continue the same
    iteration exactly (the batches prefetched by workers are replayed); loading a
    mid-epoch state raises instead of repeating or skipping samples."""

    def make() -> DataLoader:
        sampler = GroupedBatchSampler(torch.utils.data.RandomSampler(range(N)), GROUPS, 4)
        return DataLoader(
            SquaresDataset(N), batch_sampler=sampler, num_workers=num_workers, prefetch_factor=2
        ) if num_workers else DataLoader(SquaresDataset(N), batch_sampler=sampler)  # fmt: skip

    torch.manual_seed(0)
    full = run(make())
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    head = [indices(next(it)) for _ in range(3)]
    state = loader.state_dict()
    del it
    rest = run(loader)  # same process: the same epoch goes on
    assert head + rest == full
    assert len(full) == len(loader) == N // 4
    assert loader.epoch == 1

    torch.manual_seed(1)
    other = make()
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match="cannot resume epoch 0 at batch 3"):
        next(iter(other))
    boundary = make()
    boundary.load_state_dict(loader.state_dict())  # at an epoch boundary: nothing to check
    assert loader.state_dict()["sampler"]["sampler_epoch"] is None  # RandomSampler has none
    assert len(run(boundary)) == N // 4


def test_torchs_argument_rules_hold_at_construction() -> None:
    ds = SquaresDataset(8)
    batches = [[0, 1], [2, 3]]
    for clash in ({"batch_size": 2}, {"shuffle": True}, {"sampler": [0]}, {"drop_last": True}):
        with pytest.raises(ValueError, match="mutually exclusive"):
            torch.utils.data.DataLoader(ds, batch_sampler=batches, **clash)
        with pytest.raises(
            ConfigError, match=f"mutually exclusive.*also given: {next(iter(clash))}"
        ):
            DataLoader(ds, batch_sampler=batches, **clash)
    with pytest.raises(ConfigError, match="sampler is mutually exclusive with shuffle"):
        DataLoader(ds, sampler=[0, 1], shuffle=True)
    with pytest.raises(ConfigError, match="an IterableDataset orders itself; it takes no sampler"):
        DataLoader(RangeStream(8), sampler=[0, 1])
    with pytest.raises(ConfigError, match="batch_sampler must be iterable"):
        DataLoader(ds, batch_sampler=3)
    # batch_size=None under a batch_sampler is torch's spelling too
    assert run(DataLoader(ds, batch_size=None, batch_sampler=batches)) == batches  # type: ignore[arg-type]


def test_a_state_of_another_order_is_refused() -> None:
    own = DataLoader(SquaresDataset(N), batch_size=1)
    it = iter(own)
    next(it)
    own_state = own.state_dict()
    del it
    takes = DataLoader(SquaresDataset(N), batch_sampler=grouped())
    with pytest.raises(ConfigError, match="saved by a loader ordering itself"):
        takes.load_state_dict(own_state)

    def grouped_state() -> dict[str, Any]:
        lo = DataLoader(SquaresDataset(N), batch_sampler=grouped())
        it = iter(lo)
        next(it)
        return lo.state_dict()

    state = grouped_state()
    assert state["sampler"]["kind"] == "batch_sampler"
    assert state["sampler"]["sampler_epoch"] == 0  # the DistributedSampler's
    plain = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(N)), 1, False)
    with pytest.raises(ConfigError, match="GroupedBatchSampler; this loader has batch_sampler"):
        DataLoader(SquaresDataset(N), batch_sampler=plain).load_state_dict(state)
    with pytest.raises(ConfigError, match="this loader orders itself"):
        DataLoader(SquaresDataset(N), batch_size=1).load_state_dict(state)


def detection_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))  # torchvision's references/detection/utils.collate_fn


class ImagesAndTargets(torch.utils.data.Dataset[tuple[torch.Tensor, dict[str, Any]]]):
    """Detection-style items: a CHW image and a target dict."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        return torch.zeros(3, 4 + i % 3, 5), {"image_id": i, "boxes": torch.zeros(2, 4)}


@pytest.mark.parametrize(
    "args",
    [
        {"batch_sampler": "grouped"},
        {"batch_size": 3},
        {"batch_size": 3, "sampler": "sequential"},
    ],
)
def test_stats_count_images_not_channels(args: dict[str, Any]) -> None:
    """Batches that are tuples of lists of CHW tensors counted 3 samples (channels) a
    batch before; now each batch counts the indices the sampler gave it."""
    kw = dict(args)
    if kw.get("batch_sampler") == "grouped":
        kw["batch_sampler"] = grouped()
    if kw.get("sampler") == "sequential":
        kw["sampler"] = torch.utils.data.SequentialSampler(range(N))
    loader = DataLoader(ImagesAndTargets(), collate_fn=detection_collate, num_workers=1, **kw)
    served = 0
    for images, _targets in loader:
        assert images[0].shape[0] == 3
        served += len(images)
    assert served == N
    stats = loader.stats()
    assert stats.samples == N
    assert stats.batches == len(loader)


def test_stats_count_samples_of_an_iterable_dataset_by_structure() -> None:
    from fastload.loader.stats import count_samples

    images = [torch.zeros(3, 4, 4)] * 5
    assert count_samples((images, [{}] * 5), 9) == 5
    assert count_samples([{"img": torch.zeros(3, 2, 2)}] * 4, 9) == 4
    assert count_samples([torch.zeros(6, 3), torch.zeros(6)], 9) == 6
    assert count_samples({"img": torch.zeros(7, 3)}, 9) == 7


def test_iterations_dropped_mid_replay_lose_no_batch() -> None:
    """Three iterators in a row, each dropped after one batch while workers had
    prefetched more: the batches, joined, are still the uninterrupted epoch."""

    def make() -> DataLoader:
        return DataLoader(
            SquaresDataset(N), batch_sampler=grouped(), num_workers=2, prefetch_factor=2
        )

    full = run(make())
    loader = make()
    got = []
    for _ in range(3):
        it = iter(loader)
        got.append(indices(next(it)))
        del it
    got += run(loader)
    assert got == full


def test_a_refused_resume_is_refused_again_on_retry() -> None:
    def make() -> DataLoader:
        sampler = GroupedBatchSampler(torch.utils.data.RandomSampler(range(N)), GROUPS, 4)
        return DataLoader(SquaresDataset(N), batch_sampler=sampler)

    loader = make()
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    del it
    other = make()
    other.load_state_dict(state)
    for _ in range(2):
        with pytest.raises(ConfigError, match="cannot resume epoch 0 at batch 2"):
            next(iter(other))


def test_the_order_keeps_what_a_dropped_replay_did_not_reach() -> None:
    from fastload.loader.samplers import CallerOrder

    order = CallerOrder(sampler=None, batch_sampler=[[0], [1], [2], [3], [4]], batch_size=1,
                        drop_last=False)  # fmt: skip
    order.start(0, 0)
    first = iter(order)
    assert [next(first) for _ in range(3)] == [[0], [1], [2]]  # pulled ahead by torch
    assert order.consumed() == 1  # only [0] reached the caller
    order.start(0, 1)
    second = iter(order)
    assert next(second) == [1]  # replayed, then dropped before reaching the caller
    del second
    order.start(0, 1)
    assert list(order) == [[1], [2], [3], [4]]
