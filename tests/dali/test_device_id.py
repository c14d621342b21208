"""Which GPU a DALI pipeline picks when ``device_id`` is not given (no DALI needed)."""

from __future__ import annotations

from fastload.dali._pipeline import default_device_id


def test_the_current_device_wins_once_the_script_chose_one() -> None:
    # torch.cuda.set_device(3) in the training script: CUDA initialised, current 3
    assert default_device_id(local_rank=0, device_count=8, initialized=True, current=3) == 3


def test_one_visible_gpu_per_task_is_device_0_for_every_local_rank() -> None:
    # SLURM with CUDA_VISIBLE_DEVICES per task: each task sees one GPU
    assert [default_device_id(r, 1) for r in range(4)] == [0, 0, 0, 0]


def test_local_ranks_map_onto_the_visible_gpus() -> None:
    assert [default_device_id(r, 4) for r in range(4)] == [0, 1, 2, 3]
    # World.detect fell back to the global rank (no LOCAL_RANK): still a valid GPU
    assert default_device_id(13, 8) == 5


def test_no_visible_gpu_gives_0() -> None:
    assert default_device_id(2, 0) == 0
