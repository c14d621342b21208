"""The topology of a training job as a value object.

A :class:`World` says how many nodes, ranks per node and DataLoader workers there
are, and which of them *this* process is. The sampling functions take a World as an
argument, so they are pure and can be tested over virtual worlds of thousands of
ranks in one process; :meth:`World.detect` builds the World of the running process
from ``torch.distributed``, the launcher's environment variables and torch's
DataLoader worker info.

The partition uses :attr:`World.slot`, the node-major position
``node * ranks_per_node + local_rank``. It equals ``rank`` under torchrun and under
SLURM's default block distribution; a launcher that numbers ranks cyclically still
gets node-local data because the partition follows the slot, not the rank number.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastload import config
from fastload.errors import ConfigError

__all__ = ["World"]

_UNSET = -1
_SLURM_TASKS_RE = re.compile(r"^\s*(\d+)(?:\(x(\d+)\))?\s*$")


@dataclass(frozen=True)
class World:
    """Where this process sits in a job: nodes × ranks per node × DataLoader workers.

    ``rank`` and ``world_size`` default to the values derived from the node fields
    (``node * ranks_per_node + local_rank`` and ``num_nodes * ranks_per_node``);
    use :meth:`of` to build one from a rank and a world size instead. Every node
    must run the same number of ranks (the partition gives every rank an equal
    share). Raises :class:`ConfigError` on inconsistent values.
    """

    num_nodes: int = 1
    node: int = 0
    ranks_per_node: int = 1
    local_rank: int = 0
    rank: int = _UNSET
    world_size: int = _UNSET
    num_workers: int = 1
    worker: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"World.{f.name} must be an int, got {value!r}")
        if self.rank == _UNSET:
            object.__setattr__(self, "rank", self.node * self.ranks_per_node + self.local_rank)
        if self.world_size == _UNSET:
            object.__setattr__(self, "world_size", self.num_nodes * self.ranks_per_node)
        _check_index("node", self.node, "num_nodes", self.num_nodes)
        _check_index("local_rank", self.local_rank, "ranks_per_node", self.ranks_per_node)
        _check_index("worker", self.worker, "num_workers", self.num_workers)
        _check_index("rank", self.rank, "world_size", self.world_size)
        if self.world_size != self.num_nodes * self.ranks_per_node:
            raise ConfigError(
                f"World: world_size={self.world_size} is not num_nodes={self.num_nodes} × "
                f"ranks_per_node={self.ranks_per_node}; fastload needs the same number of "
                "ranks on every node"
            )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def single(cls) -> World:
        """The world of one process without workers: one node, one rank, one worker."""
        return cls()

    @classmethod
    def of(
        cls,
        rank: int,
        world_size: int,
        ranks_per_node: int | None = None,
        *,
        num_workers: int = 1,
        worker: int = 0,
    ) -> World:
        """Build a World from a global ``rank`` and ``world_size``.

        Ranks are assumed node-major (node = rank // ranks_per_node); without
        ``ranks_per_node`` all ranks are on one node. Raises :class:`ConfigError`
        if ``world_size`` is not a multiple of ``ranks_per_node``.
        """
        rpn = world_size if ranks_per_node is None else ranks_per_node
        if rpn < 1 or world_size < 1 or world_size % rpn:
            raise ConfigError(
                f"World.of: world_size={world_size} must be a positive multiple of "
                f"ranks_per_node={rpn}"
            )
        return cls(
            num_nodes=world_size // rpn,
            node=max(rank, 0) // rpn,
            ranks_per_node=rpn,
            local_rank=max(rank, 0) % rpn,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            worker=worker,
        )

    @classmethod
    def every_rank(cls, num_nodes: int, ranks_per_node: int) -> list[World]:
        """All ranks of a virtual world, in slot order (for planning and tests)."""
        return [
            cls(num_nodes=num_nodes, node=n, ranks_per_node=ranks_per_node, local_rank=r)
            for n in range(num_nodes)
            for r in range(ranks_per_node)
        ]

    def with_worker(self, worker: int, num_workers: int) -> World:
        """This World seen from DataLoader worker ``worker`` of ``num_workers``."""
        return dataclasses.replace(self, worker=worker, num_workers=num_workers)

    # ------------------------------------------------------------------ derived
    @property
    def slot(self) -> int:
        """Node-major position of this rank, ``node * ranks_per_node + local_rank``."""
        return self.node * self.ranks_per_node + self.local_rank

    @property
    def is_single(self) -> bool:
        """True when there is one rank (workers aside)."""
        return self.world_size == 1

    # ------------------------------------------------------------------ detection
    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None, *, use_torch: bool = True) -> World:
        """The World of the running process.

        Looks, in order, at an initialised ``torch.distributed`` (rank and world
        size; node-local values from ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``GROUP_RANK``
        or the launcher's variables), torchrun's variables, SLURM, OpenMPI and
        Horovod; otherwise a single process. Worker fields come from
        ``torch.utils.data.get_worker_info()``. ``environ`` replaces the process
        environment (read through :func:`fastload.config.env`) for testing;
        ``use_torch=False`` ignores torch. torch is never imported here: it is only
        consulted when the process has already imported it (a DataLoader worker or
        an initialised process group implies that). Raises :class:`ConfigError` on
        malformed or inconsistent variables.
        """
        get: Callable[[str], str | None] = environ.get if environ is not None else config.env
        torch = sys.modules.get("torch") if use_torch else None

        launcher = _from_launcher_env(get)
        rank: int | None = None
        world_size: int | None = None
        local: tuple[int, int, int | None] | None = None  # local_rank, local_size, node
        if launcher is not None:
            rank, world_size, local = launcher
        if torch is not None:
            dist_values = _from_torch_distributed(torch)
            if dist_values is not None:
                rank, world_size = dist_values
        worker, num_workers = _from_worker_info(torch) if torch is not None else (0, 1)

        if rank is None or world_size is None:
            return cls(num_workers=num_workers, worker=worker)
        if local is None:
            # rank and world size known (torch.distributed) but not the node layout:
            # treat the job as one node, which is correct for the partition.
            local = (rank, world_size, 0)
        local_rank, local_size, node = local
        if local_size < 1 or world_size % local_size:
            raise ConfigError(
                f"World.detect: world size {world_size} is not a multiple of the "
                f"{local_size} ranks per node the launcher reports"
            )
        if node is None:
            node = rank // local_size
        return cls(
            num_nodes=world_size // local_size,
            node=node,
            ranks_per_node=local_size,
            local_rank=local_rank,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            worker=worker,
        )


def _check_index(name: str, value: int, count_name: str, count: int) -> None:
    if count < 1:
        raise ConfigError(f"World.{count_name} must be >= 1, got {count}")
    if not 0 <= value < count:
        raise ConfigError(f"World.{name}={value} is outside 0..{count - 1} ({count_name}={count})")


def _int_var(get: Callable[[str], str | None], name: str) -> int | None:
    raw = get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _slurm_tasks_per_node(raw: str) -> int:
    """Parse ``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``4``, ``4(x2)``)."""
    counts = set()
    for part in raw.split(","):
        m = _SLURM_TASKS_RE.match(part)
        if not m:
            raise ConfigError(f"environment variable SLURM_NTASKS_PER_NODE={raw!r} is malformed")
        counts.add(int(m.group(1)))
    if len(counts) != 1:
        raise ConfigError(
            f"SLURM_NTASKS_PER_NODE={raw!r}: nodes run different numbers of tasks; "
            "fastload needs the same number of ranks on every node"
        )
    return counts.pop()


_Launcher = tuple[int, int, tuple[int, int, int | None] | None]


#: The variables of the launchers that give every number directly: rank, world size,
#: local rank, local size and the node's index (None: the launcher has none). torchrun
#: / torch.distributed.launch's are also what torch.distributed init reads.
_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_OPEN_MPI = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    None,
)
_HOROVOD = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
)


def _from_launcher_env(get: Callable[[str], str | None]) -> _Launcher | None:
    """(rank, world_size, (local_rank, local_size, node) or None) from the first
    launcher whose variables are present (torchrun, SLURM, Open MPI, Horovod), or None."""
    return (
        _from_launcher_vars(get, _TORCHRUN)
        or _from_slurm(get)
        or _from_launcher_vars(get, _OPEN_MPI)
        or _from_launcher_vars(get, _HOROVOD)
    )


def _from_launcher_vars(
    get: Callable[[str], str | None], names: tuple[str, str, str, str, str | None]
) -> _Launcher | None:
    """:func:`_from_launcher_env` for one launcher of ``names`` (:data:`_TORCHRUN`)."""
    rank_var, size_var, local_rank_var, local_size_var, node_var = names
    rank, size = _int_var(get, rank_var), _int_var(get, size_var)
    if rank is None or size is None:
        return None
    local_rank, local_size = _int_var(get, local_rank_var), _int_var(get, local_size_var)
    if local_rank is None or local_size is None:
        return rank, size, None
    node = None if node_var is None else _int_var(get, node_var)
    return rank, size, (local_rank, local_size, node)


def _from_slurm(get: Callable[[str], str | None]) -> _Launcher | None:
    """:func:`_from_launcher_env` for SLURM, whose local size is the tasks per node."""
    rank, size = _int_var(get, "SLURM_PROCID"), _int_var(get, "SLURM_NTASKS")
    if rank is None or size is None:
        return None
    local_rank = _int_var(get, "SLURM_LOCALID")
    per_node_raw = get("SLURM_NTASKS_PER_NODE") or get("SLURM_TASKS_PER_NODE")
    nnodes = _int_var(get, "SLURM_NNODES")
    per_node: int | None = None
    if per_node_raw is not None:
        per_node = _slurm_tasks_per_node(per_node_raw)
    elif nnodes:
        per_node = size // nnodes
    if local_rank is None or per_node is None:
        return rank, size, None
    return rank, size, (local_rank, per_node, _int_var(get, "SLURM_NODEID"))


def _from_torch_distributed(torch: Any) -> tuple[int, int] | None:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _from_worker_info(torch: Any) -> tuple[int, int]:
    data = getattr(getattr(torch, "utils", None), "data", None)
    if data is None:
        return 0, 1
    info = data.get_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)
