"""``ShardedDataset``: map-style, random access to any sample through the cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.options import EpochCell, finish, forward_epoch, make_decoder
from fastload.datasets.pixels import PixelTier, tier_or_none
from fastload.datasets.source import ShardSource, SourceBacked
from fastload.datasets.tiles import TileIndex, tile_index
from fastload.decode.pixels import PixelCache
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
    ``pixel_cache``: ``True`` or a :class:`~fastload.PixelCache` keeps each image's
    decoded pixels (decode, draft, ``size`` resize: the deterministic part) in the
    disk tier the first time its shard is decoded; later epochs, processes and jobs
    read them with no decode and get exactly what a fresh decode gives. ``transform``
    (random augmentation) runs after it, on the uint8 outputs. Needs ``decode=`` as a
    string, a :class:`~fastload.decode.Decoder`, or a
    :class:`~fastload.decode.CropDecoder` (the tier then stores each image whole, at
    full size or ``PixelCache(max_side=...)``, and each epoch's crop is cut from those
    pixels and resized: no decode from the second epoch; not with ``Tiles``, a
    :class:`~fastload.errors.ConfigError`; see docs/howto-pixels.md and
    docs/howto-crops.md).
    With ``decode=CropDecoder(Tiles(...))`` every tile of each image is an item
    (``len(ds)`` counts tiles, read from the images' headers on first use; ``ds[u]``
    is tile ``t`` of sample ``i`` keyed ``"<key>/<row>_<col>"``, samples in manifest
    order, tiles row by row; see docs/howto-crops.md).
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
        pixel_cache: bool | PixelCache = False,
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
        #: the decoded-pixel tier (``pixel_cache=``), None when off
        self.pixels: PixelTier | None = tier_or_none(self.source, self.decoder, pixel_cache)
        #: the tiles (a CropDecoder of Tiles: each tile is an item), None otherwise
        self.tiles: TileIndex | None = tile_index(self.source, self.decoder)
        # a decoder with per-epoch draws (CropDecoder) follows set_epoch in every worker:
        # the epoch last set through the dataset (-1: none yet), and the one this
        # process applied (a decoder's own set_epoch holds until the next one)
        self._epoch: EpochCell | None = (
            EpochCell(-1) if callable(getattr(self.decoder, "set_epoch", None)) else None
        )
        self._applied = -1

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s crops: passed on to a decoder with its own
        ``set_epoch`` (a :class:`~fastload.decode.CropDecoder`), here and, through
        shared memory, in the DataLoader workers holding copies of this dataset
        (persistent ones too). Call it beside the sampler's ``set_epoch``; a no-op for
        other decoders."""
        if self._epoch is not None:
            self._epoch.set(epoch)
            self._applied = int(epoch)
        forward_epoch(self.decoder, epoch)

    def _follow_epoch(self) -> None:
        if self._epoch is not None:
            epoch = self._epoch.get()
            if epoch >= 0 and epoch != self._applied:
                self._applied = epoch
                forward_epoch(self.decoder, epoch)

    def __len__(self) -> int:
        if self.tiles is not None:
            return self.tiles.total
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        if self.tiles is not None:
            sample, t = self.tiles.locate(int(i))
            item = self.decoder.tile(self.source.read(sample), t)  # type: ignore[union-attr]
            return finish(item, None, self.transform)
        self._follow_epoch()
        if self.pixels is not None:
            shard, j = self.source.locate(int(i))
            return finish(self.pixels.sample(shard, j), None, self.transform)
        return finish(self.source.read(int(i)), self.decoder, self.transform)

    @property
    def batch_transport(self) -> bool:
        """Whether :class:`fastload.DataLoader` may build this dataset's batches in its
        own process from the cache (workers send where the bytes are, not the bytes):
        true unless a subclass changes how items are made or the pixel tier serves
        them (each worker then reads its samples' pixels itself), nor with tiles (an
        index is a tile, not a sample)."""
        return (
            self.pixels is None
            and self.tiles is None
            and type(self).__getitem__ is ShardedDataset.__getitem__
        )

    def close(self) -> None:
        """Release open shards, pixel shards and background threads of this process."""
        if self.pixels is not None:
            self.pixels.close()
        super().close()

    def __repr__(self) -> str:
        return (
            f"ShardedDataset({self.url!r}, samples={len(self.source)}, "
            f"shards={len(self.manifest.shards)})"
        )
