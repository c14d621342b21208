"""Sampling: the epoch order, its partition over a :class:`World`, and resume.

Pure functions of (dataset shape, seed, epoch, world); no torch import. See
:mod:`fastload.sampling.plan` for the invariants.
"""

from __future__ import annotations

from fastload.sampling.order import (
    DEFAULT_WINDOW_SHARDS,
    EpochLayout,
    epoch_order,
    permute_positions,
    span_bounds,
)
from fastload.sampling.plan import (
    PAD_MODES,
    SamplerState,
    epoch_steps,
    global_batches,
    map_rank_indices,
    plan_from_state,
    plan_rank,
    rank_samples,
    shard_of,
    shards_in_order,
    shards_touched,
    worker_indices,
)
from fastload.sampling.world import World

__all__ = [
    "DEFAULT_WINDOW_SHARDS",
    "PAD_MODES",
    "EpochLayout",
    "SamplerState",
    "World",
    "epoch_order",
    "epoch_steps",
    "global_batches",
    "map_rank_indices",
    "permute_positions",
    "plan_from_state",
    "plan_rank",
    "rank_samples",
    "shard_of",
    "shards_in_order",
    "shards_touched",
    "span_bounds",
    "worker_indices",
]
