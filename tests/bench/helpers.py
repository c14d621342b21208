"""Shared pieces of the bench tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastload.bench.verdict import Figures


@dataclass(frozen=True)
class S3Dataset:
    """A converted dataset: ``url`` (shards), ``raw_url`` (one object per image),
    ``storage_options``, ``samples``, ``bytes`` (of all shards), ``shards``."""

    url: str
    raw_url: str
    storage_options: dict[str, Any]
    samples: int
    bytes: int
    shards: int

    @property
    def options_json(self) -> str:
        """``--storage-options`` for the CLI."""
        return json.dumps(self.storage_options)


MB = 10**6

# A healthy pipeline: fast store, fast cache, decode the narrowest (300 img/s per process,
# 4 workers on 8 cores) but the loader close to it.
BASE = Figures(
    dataset_bytes=100 * MB,
    samples=1000,
    workers=4,
    cores=8,
    remote_ceiling_mb_s=900.0,
    cold_sps=8000.0,
    cold_mb_s=800.0,
    warm_sps=20000.0,
    warm_remote_bytes=0,
    ram_sps=500000.0,
    decode_sps_per_worker=300.0,
    loader_sps=1100.0,
)
