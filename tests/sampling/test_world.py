"""World: construction, validation, and detect() for every launcher."""

from __future__ import annotations

import os

import pytest

from fastload.errors import ConfigError
from fastload.sampling.world import World


def test_defaults_derive_rank_and_world_size() -> None:
    w = World(num_nodes=3, node=2, ranks_per_node=4, local_rank=1)
    assert (w.rank, w.world_size, w.slot) == (9, 12, 9)
    assert World.single() == World()
    assert World.single().is_single
    assert not w.is_single


def test_of_is_node_major() -> None:
    w = World.of(13, 16, ranks_per_node=4, num_workers=2, worker=1)
    assert (w.num_nodes, w.node, w.local_rank, w.rank, w.world_size) == (4, 3, 1, 13, 16)
    assert (w.num_workers, w.worker) == (2, 1)
    one_node = World.of(5, 8)
    assert (one_node.num_nodes, one_node.ranks_per_node, one_node.local_rank) == (1, 8, 5)


def test_with_worker_keeps_the_rest() -> None:
    w = World.of(3, 8, 4).with_worker(2, 3)
    assert (w.worker, w.num_workers, w.rank, w.node) == (2, 3, 3, 0)


def test_every_rank_lists_slots_in_order() -> None:
    worlds = World.every_rank(3, 2)
    assert [w.slot for w in worlds] == list(range(6))
    assert {w.world_size for w in worlds} == {6}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_nodes": 0},
        {"node": 2, "num_nodes": 2},
        {"local_rank": -1},
        {"ranks_per_node": 2, "local_rank": 2},
        {"num_workers": 2, "worker": 2},
        {"num_workers": 0},
        {"rank": 4, "world_size": 4, "num_nodes": 2, "ranks_per_node": 2},
        {"world_size": 6, "num_nodes": 2, "ranks_per_node": 2},
        {"node": True},
        {"rank": 1.0},
    ],
)
def test_inconsistent_worlds_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="World"):
        World(**kwargs)  # type: ignore[arg-type]


def test_of_rejects_uneven_nodes() -> None:
    with pytest.raises(ConfigError, match="multiple"):
        World.of(0, 6, ranks_per_node=4)


# ---------------------------------------------------------------- detect()


def test_detect_single_without_variables() -> None:
    assert World.detect({}, use_torch=False) == World.single()


def test_detect_torchrun() -> None:
    env = {"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    w = World.detect({**env, "GROUP_RANK": "3"}, use_torch=False)
    assert (w.num_nodes, w.node, w.ranks_per_node, w.local_rank, w.rank) == (4, 3, 4, 1, 13)
    # without GROUP_RANK the node is derived from the node-major rank
    assert World.detect(env, use_torch=False) == w


def test_detect_torchrun_without_local_values_is_one_node() -> None:
    w = World.detect({"RANK": "2", "WORLD_SIZE": "3"}, use_torch=False)
    assert (w.num_nodes, w.ranks_per_node, w.local_rank, w.rank) == (1, 3, 2, 2)


def test_detect_torchrun_wins_over_slurm() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
    }
    assert World.detect(env, use_torch=False).rank == 1


@pytest.mark.parametrize("per_node", ["4(x2)", "4", "4(x1),4"])
def test_detect_slurm(per_node: str) -> None:
    env = {
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "2",
        "SLURM_NTASKS_PER_NODE": per_node,
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
    }
    w = World.detect(env, use_torch=False)
    assert (w.num_nodes, w.node, w.ranks_per_node, w.local_rank, w.rank) == (2, 1, 4, 2, 6)


def test_detect_slurm_cyclic_distribution_uses_node_and_local_rank() -> None:
    # cyclic: rank 1 is on node 1 as its first task; the partition follows the slot
    env = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NODEID": "1",
    }
    w = World.detect(env, use_torch=False)
    assert (w.rank, w.node, w.local_rank, w.slot) == (1, 1, 0, 2)


def test_detect_slurm_tasks_per_node_from_node_count() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NNODES": "2"}
    w = World.detect(env, use_torch=False)
    assert (w.num_nodes, w.node, w.local_rank) == (2, 1, 1)


def test_detect_slurm_heterogeneous_nodes_is_an_error() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "7",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS_PER_NODE": "4,3",
    }
    with pytest.raises(ConfigError, match="different numbers of tasks"):
        World.detect(env, use_torch=False)


def test_detect_openmpi() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
    }
    w = World.detect(env, use_torch=False)
    assert (w.num_nodes, w.node, w.ranks_per_node, w.local_rank, w.rank) == (2, 1, 3, 2, 5)


def test_detect_horovod() -> None:
    env = {
        "HOROVOD_RANK": "3",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1",
    }
    w = World.detect(env, use_torch=False)
    assert (w.num_nodes, w.node, w.ranks_per_node, w.local_rank, w.rank) == (2, 1, 2, 1, 3)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "multiple"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank=4"),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS_PER_NODE": "two",
            },
            "malformed",
        ),
    ],
)
def test_detect_bad_variables(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        World.detect(env, use_torch=False)


def test_detect_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(
            ("RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "SLURM_", "OMPI_", "HOROVOD_")
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    assert World.detect(use_torch=False).rank == 1


def test_importing_sampling_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fastload.sampling as s; s.World.detect(); "
        "s.plan_rank([4, 4], 0, 0, s.World.single(), 2); "
        "sys.exit('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
