"""fastload.loader: the torch layer — :class:`DataLoader` with exact resume, pinned
memory, side-stream device copies and statistics.

Importing this package imports torch.
"""

from fastload.loader.dataloader import STATE_VERSION, DataLoader, ResumableIterable
from fastload.loader.device import (
    CudaCopyStream,
    DevicePrefetcher,
    HostBufferPool,
    PoolStats,
    SyncCopyStream,
)
from fastload.loader.sampler import RankLayout, ResumableSampler, epoch_order
from fastload.loader.stats import IOStatsSource, LoaderStats

__all__ = [
    "STATE_VERSION",
    "CudaCopyStream",
    "DataLoader",
    "DevicePrefetcher",
    "HostBufferPool",
    "IOStatsSource",
    "LoaderStats",
    "PoolStats",
    "RankLayout",
    "ResumableIterable",
    "ResumableSampler",
    "SyncCopyStream",
    "epoch_order",
]
