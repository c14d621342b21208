"""Several real ranks (torch.distributed, gloo, spawned processes): the default
World is detected, ranks partition the epoch, and their states agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

N = 30
BATCH = 4
WORLD = 2


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        from fastload.loader import DataLoader

        from .doubles import SquaresDataset, indices

        loader = DataLoader(SquaresDataset(N), batch_size=BATCH, shuffle=True, seed=5)
        it = iter(loader)
        head = [indices(next(it)) for _ in range(2)]
        state = loader.state_dict()
        tail = [indices(b) for b in it]
        result = {
            "rank": loader.layout.rank,
            "world_size": loader.layout.world_size,
            "head": head,
            "tail": tail,
            "state": state,
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_real_ranks_partition_the_epoch_and_agree_on_state(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["world_size"] == WORLD for r in results)
    assert results[0]["state"] == results[1]["state"]
    assert results[0]["state"]["batches_consumed"] == 2
    counts = {len(r["head"]) + len(r["tail"]) for r in results}
    assert counts == {4}  # 15 samples per rank in batches of 4: the same count on each
    seen = sorted(i for r in results for b in r["head"] + r["tail"] for i in b)
    assert seen == list(range(N))  # 30 = 2 x 15: no padding, each sample once
