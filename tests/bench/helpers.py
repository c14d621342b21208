"""Shared pieces of the bench tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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
