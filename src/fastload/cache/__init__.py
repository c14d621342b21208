"""fastload.cache: the node-local tiers between object storage and the readers.

:class:`ShardCache` is the facade the datasets use (see :mod:`fastload.cache.shard_cache`);
:class:`DiskTier` is the NVMe tier (atomic publish, single flight across processes, byte
cap with LRU eviction, crash recovery), :class:`RamTier` a byte-budgeted LRU of bytes,
:class:`Prefetcher` the background stager, and :func:`choose_victims` the pure policy.
"""

from __future__ import annotations

from fastload.cache.catalog import EntryState
from fastload.cache.disk import BadEntry, DiskTier, DiskTierStats, EntryInfo, EntryKey, FetchFn
from fastload.cache.policy import Candidate, choose_victims
from fastload.cache.prefetch import Prefetcher, PrefetchStats
from fastload.cache.ram import RamTier, RamTierStats
from fastload.cache.shard_cache import CachedShard, ShardCache, dataset_id

__all__ = [
    "BadEntry",
    "CachedShard",
    "Candidate",
    "DiskTier",
    "DiskTierStats",
    "EntryInfo",
    "EntryKey",
    "EntryState",
    "FetchFn",
    "PrefetchStats",
    "Prefetcher",
    "RamTier",
    "RamTierStats",
    "ShardCache",
    "choose_victims",
    "dataset_id",
]
