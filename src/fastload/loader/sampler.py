"""A resumable, rank-partitioned sampler for map-style datasets.

The order of an epoch is a pure function of ``(length, seed, epoch)``. Ranks take
strided slices of that global order (rank ``r`` gets global positions ``r, r+W,
r+2W, ...``), so global batch ``j`` of a job with per-rank batch ``B`` is exactly
the contiguous block ``[j*B*W, (j+1)*B*W)`` of the global order. Resuming therefore
needs one number, the global count of samples consumed, and works onto a different
number of ranks as long as the global batch size ``B*W`` stays the same.

This is the loader's own partition, apart from :mod:`fastload.sampling` (whose
:func:`~fastload.sampling.map_rank_indices` gives each rank a contiguous run of every
global batch, and whose :func:`~fastload.sampling.epoch_order` is the shard-windowed
order of the iterable datasets): both permute with the same keyed
:func:`~fastload.sampling.permute_positions`, but the strided split is the order
existing checkpoints of map-style loaders resume into, so it stays. Its function is
:func:`sampler_order`; the old name ``epoch_order`` (which clashed with
``fastload.sampling.epoch_order``'s different signature) still imports, with a
:class:`DeprecationWarning`, for one release.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from fastload.errors import ConfigError

__all__ = [
    "RankLayout",
    "ResumableSampler",
    "detect_rank_layout",
    "per_rank_count",
    "sampler_order",
]


class RankLayout:
    """This process's rank and the number of ranks (a plain value object)."""

    __slots__ = ("rank", "world_size")

    def __init__(self, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is not in a world of {world_size} rank(s)")
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"RankLayout(rank={self.rank}, world_size={self.world_size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RankLayout) and (self.rank, self.world_size) == (
            other.rank,
            other.world_size,
        )

    def __hash__(self) -> int:
        return hash((self.rank, self.world_size))


def detect_rank_layout(world: Any = None) -> RankLayout:
    """Return the :class:`RankLayout` of ``world`` (a ``fastload.World`` or anything with
    integer ``rank`` and ``world_size`` attributes), or of this process when ``world``
    is None (``fastload.World.detect()``).

    Raises :class:`ConfigError` when ``world`` lacks those attributes.
    """
    if world is None:
        from fastload.sampling.world import World

        world = World.detect()
    if isinstance(world, RankLayout):
        return world
    rank = getattr(world, "rank", None)
    size = getattr(world, "world_size", None)
    if not isinstance(rank, int) or not isinstance(size, int):
        raise ConfigError(
            f"world {world!r}: expected integer attributes 'rank' and 'world_size' "
            "(a fastload.World)"
        )
    return RankLayout(rank, size)


def sampler_order(
    positions: np.ndarray, length: int, *, shuffle: bool, seed: int, epoch: int
) -> np.ndarray:
    """Map global ``positions`` (``0 <= p``; positions past ``length`` wrap around, which
    pads the epoch) to dataset indices: through the map-style permutation of
    :func:`fastload.sampling.permute_positions` keyed by ``(seed, epoch)`` when
    ``shuffle``, else unchanged. Returns int64 indices. (Called ``epoch_order`` before;
    that name still imports, with a :class:`DeprecationWarning`.)"""
    pos = np.asarray(positions, dtype=np.int64) % max(length, 1)
    if not shuffle or length <= 1:
        return pos
    from fastload.sampling import permute_positions

    return permute_positions(pos, length, seed, epoch)


#: Names that moved, kept importable (with a DeprecationWarning) for one release.
_RENAMED = {"epoch_order": "sampler_order"}


def renamed(module: str, name: str) -> Any:
    """The object behind a renamed name of ``module``, after a DeprecationWarning
    saying what to import instead (the PEP 562 ``__getattr__`` of this module and of
    :mod:`fastload.loader`). Raises AttributeError for any other name."""
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is renamed {module}.{new} (fastload.sampling.{name} is the "
        f"shard-windowed order of the iterable datasets, a different function); "
        f"the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return globals()[new]


def __getattr__(name: str) -> Any:
    return renamed(__name__, name)


def per_rank_count(length: int, world_size: int, drop_last: bool) -> int:
    """Samples each rank gets per epoch: the tail is dropped (``drop_last``) or the
    order is padded by wrapping around, so every rank gets the same count."""
    if drop_last:
        return length // world_size
    return -(-length // world_size)


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yields this rank's indices of one epoch, starting after ``samples_consumed``
    global positions (consumed indices are skipped, never loaded).

    ``set_epoch(e)`` selects the permutation; ``set_start(n)`` the resume point
    (``n`` global samples, a multiple of the world size).
    """

    def __init__(
        self,
        length: int,
        *,
        shuffle: bool,
        seed: int,
        layout: RankLayout,
        drop_last: bool,
    ) -> None:
        if length < 0:
            raise ConfigError(f"dataset length must not be negative, got {length}")
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.layout = layout
        self.drop_last = drop_last
        self.epoch = 0
        self.samples_consumed = 0

    @property
    def total(self) -> int:
        """Global positions per epoch after dropping or padding (a multiple of the world)."""
        return per_rank_count(self.length, self.layout.world_size, self.drop_last) * (
            self.layout.world_size
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration yields."""
        self.epoch = epoch

    def set_start(self, samples_consumed: int) -> None:
        """Skip the first ``samples_consumed`` global positions on the next iteration.

        Raises :class:`ConfigError` if it is not a multiple of the world size or
        exceeds the epoch.
        """
        w = self.layout.world_size
        if samples_consumed % w or not 0 <= samples_consumed <= self.total:
            raise ConfigError(
                f"resume point {samples_consumed} is not a multiple of the world size {w} "
                f"within an epoch of {self.total} positions"
            )
        self.samples_consumed = samples_consumed

    def rank_indices(self) -> np.ndarray:
        """This rank's dataset indices for the rest of the epoch (computed for this
        rank only: O(samples per rank))."""
        w = self.layout.world_size
        positions = np.arange(self.samples_consumed + self.layout.rank, self.total, w)
        return sampler_order(
            positions, self.length, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.rank_indices().tolist())

    def __len__(self) -> int:
        return (self.total - self.samples_consumed) // self.layout.world_size
