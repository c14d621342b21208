"""``StreamingDataset``: an iterable over the epoch's plan for this rank and worker.

Each iteration plans the rank's part of the epoch with :mod:`fastload.sampling`
(shards permuted and windowed, samples shuffled within windows, node-contiguous
spans, equal batches per rank), keeps the DataLoader worker's batches (round-robin,
so torch's order over workers is the rank's order), reads samples through the cache
and keeps the next shards of the worker's own plan prefetching.

It implements :class:`fastload.loader.dataloader.ResumableIterable`: with
:class:`fastload.DataLoader` the state ``(seed, epoch, samples consumed)`` resumes
exactly, also onto another world size with the same global batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.options import finish, forward_epoch, make_decoder
from fastload.datasets.pixels import PixelTier, tier_or_none
from fastload.datasets.planned import PlannedIterable
from fastload.datasets.source import ShardSource
from fastload.datasets.tiles import TileIndex, tile_index
from fastload.decode.pixels import PixelCache
from fastload.sampling import World
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.shards.manifest import Manifest

__all__ = ["StreamingDataset"]


class StreamingDataset(PlannedIterable):
    """Iterate this rank's (and DataLoader worker's) share of the dataset at ``url``.

    ``shuffle``/``seed`` fix the order of every epoch (``set_epoch(e)`` picks the
    epoch); ``window_shards`` is how many shards are shuffled together (more: better
    mixing, more shards open and cached at once). ``world`` defaults to
    :meth:`World.detect` in the iterating process. ``drop_last=False`` ends the
    epoch with a short last batch and pads only so that every rank yields the same
    count (at most world_size - 1 repeated samples, none on one rank: the epoch is
    the dataset, so evaluation counts each sample once); ``True`` drops the
    remainder, keeping full batches. ``prefetch_shards`` upcoming shards of the
    worker's own plan download in the background.

    ``state_dict()``/``load_state_dict()`` follow torchdata's convention: a
    ``torchdata.stateful_dataloader.StatefulDataLoader`` saves each worker's
    position and resumes it exactly (same number of workers).

    Samples are ``{"__key__": str, field: bytes}`` (or decoded/transformed like
    :class:`~fastload.ShardedDataset`'s, with its ``pixel_cache`` tier, which with a
    :class:`~fastload.decode.CropDecoder` cuts each epoch's crops from the stored
    pixels). With
    ``decode=CropDecoder(Tiles(...))`` the units planned, shuffled and split are the
    tiles: each tile of each image is a sample keyed ``"<key>/<row>_<col>"`` and the
    epoch's length counts tiles (the first plan reads every image's header). Raises
    like ShardedDataset on a bad dataset.
    """

    _state_kind = "fastload.streaming"
    _state_label = "StreamingDataset"
    _pad = "ranks"  # every rank the same count; an evaluation epoch counts each sample once

    @keyword_only("shuffle", "seed", "cache_dir", "cache_limit", "storage_options")
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
        shuffle: bool = True,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        decode: Any = None,
        size: Any = None,
        transform: Callable[[Any], Any] | None = None,
        max_open_shards: int | None = None,
        pixel_cache: bool | PixelCache = False,
    ) -> None:
        super().__init__()
        self._init_plan(
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            window_shards=window_shards,
            prefetch_shards=prefetch_shards,
            world=world,
        )
        self.source = ShardSource(
            url,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            max_open_shards=(
                max(2, window_shards + prefetch_shards)
                if max_open_shards is None
                else max_open_shards
            ),
            manifest=manifest,
            cache_config=cache_config,
        )
        self.decoder = make_decoder(decode, size)
        self.transform = transform
        #: the decoded-pixel tier (``pixel_cache=``), None when off
        self.pixels: PixelTier | None = tier_or_none(self.source, self.decoder, pixel_cache)
        #: the tiles (a CropDecoder of Tiles: each tile is a unit), None otherwise
        self.tiles: TileIndex | None = tile_index(self.source, self.decoder)

    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` next; a decoder with its own ``set_epoch`` (a
        :class:`~fastload.decode.CropDecoder`'s draws) follows. Under
        :class:`fastload.DataLoader` this runs in each worker at each epoch's start,
        so persistent workers draw the new epoch's crops too."""
        super().set_epoch(epoch)
        forward_epoch(self.decoder, epoch)

    def unit_counts(self) -> Sequence[int] | np.ndarray:
        """Samples per shard: the plan's units are the dataset's samples (tiles with
        a tiled decoder)."""
        if self.tiles is not None:
            return self.tiles.shard_counts()
        return self.source.shard_samples

    @property
    def num_units(self) -> int:
        """Samples (tiles) in the dataset."""
        if self.tiles is not None:
            return self.tiles.total
        return len(self.source)

    # -------------------------------------------------------------- iterating
    def _positions(self, prefetch: bool = True) -> Iterator[tuple[int, int]]:
        """``(shard, index in shard)`` of this worker's samples, in order."""
        starts = self.source._starts
        for s, i in self.plan_units(prefetch):
            yield s, i - int(starts[s])

    def _tiles(self) -> Iterator[Any]:
        assert self.tiles is not None
        starts = self.source._starts
        for s, u in self.plan_units():
            i, t = self.tiles.locate(u)
            raw = self.source.read_local(s, i - int(starts[s]))
            yield finish(self.decoder.tile(raw, t), None, self.transform)  # type: ignore[union-attr]

    def __iter__(self) -> Iterator[Any]:
        if self.tiles is not None:
            yield from self._tiles()
            return
        pixels = self.pixels
        if pixels is not None:
            # while a shard is being built elsewhere, build one this rank reads next
            pixels.candidates = [int(s) for s in self.plan_shards()[0]]
            for s, j in self._positions():
                yield finish(pixels.sample(s, j), None, self.transform)
            return
        for s, j in self._positions():
            yield finish(self.source.read_local(s, j), self.decoder, self.transform)

    def iter_refs(self) -> Iterator[Any]:
        """The same samples as ``iter(self)``, as :class:`~fastload.datasets.source.SampleRef`
        records (where the bytes are) for the loader's batch transport. The loader's
        process prefetches the whole rank's plan in order, so workers do not."""
        for s, j in self._positions(prefetch=False):
            yield self.source.ref_local(s, j)

    @property
    def batch_transport(self) -> bool:
        """Whether :class:`fastload.DataLoader` may build this dataset's batches in its
        own process from the cache (see :meth:`iter_refs`): not with the pixel tier,
        whose samples each worker reads itself."""
        return (
            self.pixels is None
            and self.tiles is None
            and type(self).__iter__ is StreamingDataset.__iter__
        )

    def close(self) -> None:
        """Release open shards, pixel shards and background threads of this process."""
        if self.pixels is not None:
            self.pixels.close()
        super().close()

    def __repr__(self) -> str:
        return (
            f"StreamingDataset({self.source.url!r}, samples={len(self.source)}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )
