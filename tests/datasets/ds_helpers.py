"""Small datasets written with ShardWriter, for the dataset tests."""

from __future__ import annotations

import hashlib
from typing import Any

from fastload.shards.manifest import Manifest
from fastload.shards.writer import ShardWriter


def payload(i: int, size: int = 700) -> bytes:
    """Deterministic, distinct bytes for sample ``i``."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // len(seed) + 1))[: size + i % 97]


def write_dataset(
    url: str,
    n: int = 120,
    shard_size: str = "16KB",
    storage_options: dict[str, Any] | None = None,
    size: int = 700,
) -> Manifest:
    """Write ``n`` samples ``{"__key__": "s00042", "bin": payload(42), "cls": 42 % 10}``."""
    with ShardWriter(url, shard_size=shard_size, storage_options=storage_options) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:05d}", "bin": payload(i, size), "cls": i % 10})
    assert w.manifest is not None
    return w.manifest


def index_of(sample: dict[str, Any]) -> int:
    """The sample number a sample's key encodes."""
    return int(sample["__key__"][1:])
