"""fastload.loader: the torch layer — :class:`DataLoader` with exact resume, pinned
memory, side-stream device copies and statistics.

Importing this package imports torch.
"""

from typing import Any

from fastload.loader.dataloader import STATE_VERSION, DataLoader, ResumableIterable
from fastload.loader.device import (
    CudaCopyStream,
    DevicePrefetcher,
    HostBufferPool,
    PoolStats,
    SyncCopyStream,
)
from fastload.loader.sampler import RankLayout, ResumableSampler, sampler_order
from fastload.loader.stats import IOStatsSource, LoaderStats
from fastload.loader.transport_plan import BatchTransportDataset

__all__ = [
    "STATE_VERSION",
    "BatchTransportDataset",
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
    "sampler_order",
]


def __getattr__(name: str) -> Any:
    # epoch_order, renamed sampler_order: importable with a DeprecationWarning
    from fastload.loader.sampler import renamed

    return renamed(__name__, name)
