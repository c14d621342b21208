"""With torch: World.detect in DataLoader workers and under torch.distributed, and the
worker split driven through a real torch DataLoader (0-3 worker processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastload.sampling import World, plan_rank, worker_indices

pytest.importorskip("torch", reason="the torch extra is part of the test environment")
from torch.utils.data import DataLoader, IterableDataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class _WorldsDataset(IterableDataset):
    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        w = World.detect({})
        yield (w.worker, w.num_workers, w.rank)


def test_detect_in_dataloader_workers() -> None:
    loader = DataLoader(_WorldsDataset(), batch_size=None, num_workers=3)
    seen = sorted(tuple(int(x) for x in item) for item in loader)
    assert seen == [(0, 3, 0), (1, 3, 0), (2, 3, 0)]
    # in the main process there is no worker info
    assert World.detect({}).num_workers == 1


def _dist_child(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # the variables claim rank 0 for both; the process group's rank wins, and
        # the node layout still comes from LOCAL_RANK / LOCAL_WORLD_SIZE
        env = {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"}
        w = World.detect(env)
        Path(out_dir, f"{rank}.txt").write_text(f"{w.rank} {w.world_size} {w.local_rank}")
    finally:
        dist.destroy_process_group()


def test_detect_from_torch_distributed(tmp_path: Path) -> None:
    import torch.multiprocessing as tmp

    tmp.start_processes(
        _dist_child,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        start_method="fork",
    )
    got = {p.name: p.read_text() for p in tmp_path.glob("*.txt")}
    assert got == {"0.txt": "0 2 0", "1.txt": "1 2 1"}


class _RankStream(IterableDataset):
    """Yields this worker's part of a rank sequence, one index at a time."""

    def __init__(self, rank_plan: np.ndarray, batch_size: int) -> None:
        self.rank_plan = rank_plan
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[int]:
        w = World.detect({})
        yield from worker_indices(self.rank_plan, self.batch_size, w.num_workers, w.worker).tolist()


def _loader_output(rank_plan: np.ndarray, batch_size: int, num_workers: int) -> list[int]:
    loader = DataLoader(
        _RankStream(rank_plan, batch_size), batch_size=batch_size, num_workers=num_workers
    )
    return [int(x) for batch in loader for x in batch]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_dataloader_output_equals_the_rank_sequence(num_workers: int) -> None:
    world = World.of(1, 2)
    # 3 shards of 7 samples, 2 ranks × B=3, pad: 4 steps, 4 batches per rank, so the
    # batch count is not a multiple of 3 workers; plus a rank plan with a short tail
    plan = plan_rank([7, 7, 7], seed=3, epoch=1, world=world, batch_size=3)
    assert plan.size == 12
    assert _loader_output(plan, 3, num_workers) == plan.tolist()
    ragged = np.arange(100, 123)  # 7 full batches of 3 and a batch of 2
    assert _loader_output(ragged, 3, num_workers) == ragged.tolist()


@pytest.mark.parametrize(("before", "after"), [(0, 3), (2, 1), (3, 2), (1, 0)])
def test_dataloader_resume_with_other_workers(before: int, after: int) -> None:
    counts = [5, 9, 6, 4]
    world = World.single()
    full = plan_rank(counts, seed=9, epoch=0, world=world, batch_size=2, drop_last=True)
    loader = DataLoader(_RankStream(full, 2), batch_size=2, num_workers=before)
    consumed: list[int] = []
    for step, batch in enumerate(loader):
        consumed += [int(x) for x in batch]
        if step == 4:
            break
    rest = plan_rank(
        counts,
        seed=9,
        epoch=0,
        world=world,
        batch_size=2,
        drop_last=True,
        samples_consumed=len(consumed),
    )
    assert consumed + _loader_output(rest, 2, after) == full.tolist()
