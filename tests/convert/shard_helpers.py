"""Reading a written dataset back, for the converter tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastload.shards.manifest import Manifest
from fastload.shards.reader import ShardReader


def read_dataset(root: Path) -> tuple[Manifest, list[dict[str, Any]]]:
    """The manifest and every sample of the dataset at ``root``, fields as bytes, in order."""
    manifest = Manifest.load(str(root))
    samples = []
    for info in manifest.shards:
        with ShardReader(root / info.name) as reader:
            for i in range(len(reader)):
                s = reader[i]
                samples.append({k: v if isinstance(v, str) else bytes(v) for k, v in s.items()})
    return manifest, samples
