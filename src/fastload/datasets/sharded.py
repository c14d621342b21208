"""``ShardedDataset``: map-style, random access to any sample through the cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.options import finish, make_decoder
from fastload.datasets.source import ShardSource, SourceBacked
from fastload.shards.manifest import Manifest

__all__ = ["ShardedDataset"]


class ShardedDataset(SourceBacked):
    """A map-style dataset over fastload shards at ``url``.

    ``len(ds)`` is the manifest's sample count and ``ds[i]`` the i-th sample in
    manifest order as written: ``{"__key__": str, field: bytes, ...}`` (or what
    ``decode``/``transform`` make of it). Start-up reads only ``manifest.json``;
    a shard and its index are fetched the first time one of its samples is read,
    into the node's NVMe tier when ``cache_dir`` is given (``cache_limit`` caps it)
    or into this process's RAM tier otherwise. Works in DataLoader workers (fork or
    spawn): nothing holding a socket or a sqlite handle is inherited.

    ``decode``: None (bytes), ``"pil"``/``"numpy"``/``"tensor"`` (with ``size``), or
    a callable on the sample dict; ``transform`` is applied after it.
    ``max_open_shards``: shards kept mapped per process (None: every shard when the
    tier has no cap, so a shuffled epoch re-opens none; see
    :func:`fastload.datasets.source.default_open_shards`).
    Raises :class:`~fastload.errors.ShardFormatError` for a bad manifest,
    :class:`~fastload.errors.StorageError` when it cannot be read.
    """

    @keyword_only("cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        manifest: Manifest | None = None,
        decode: Any = None,
        size: Any = None,
        transform: Callable[[Any], Any] | None = None,
        max_open_shards: int | None = None,
    ) -> None:
        self.source = ShardSource(
            url,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            manifest=manifest,
            cache_config=cache_config,
            max_open_shards=max_open_shards,
        )
        self.decoder = make_decoder(decode, size)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        return finish(self.source.read(int(i)), self.decoder, self.transform)

    @property
    def batch_transport(self) -> bool:
        """Whether :class:`fastload.DataLoader` may build this dataset's batches in its
        own process from the cache (workers send where the bytes are, not the bytes):
        true unless a subclass changes how items are made."""
        return type(self).__getitem__ is ShardedDataset.__getitem__

    def __repr__(self) -> str:
        return (
            f"ShardedDataset({self.url!r}, samples={len(self)}, shards={len(self.manifest.shards)})"
        )
