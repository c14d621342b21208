"""The tiles of a dataset whose decoder serves every tile as its own sample.

A :class:`~fastload.decode.CropDecoder` with :class:`~fastload.decode.Tiles` turns
each sample into ``count_tiles(sample)`` samples. :class:`TileIndex` numbers them:
tile ``u`` of the dataset is tile ``t`` of sample ``i``, samples in manifest order,
each sample's tiles row by row. The counts come from each sample's first image
header, read once per dataset (the first ``len()``; it fetches every shard into the
cache) and carried to DataLoader workers with the dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastload.datasets.source import ShardSource

__all__ = ["TileIndex", "tile_index"]


class TileIndex:
    """Tiles per sample of ``source`` under ``decoder`` (a tiled ``CropDecoder``),
    counted on first use."""

    def __init__(self, source: ShardSource, decoder: Any) -> None:
        self.source = source
        self.decoder = decoder
        self._counts: np.ndarray | None = None  # tiles of each sample
        self._starts: np.ndarray | None = None  # first tile of each sample, and the total

    def _count(self) -> None:
        src = self.source
        counts = np.zeros(len(src), dtype=np.int64)
        i = 0
        for shard, n in enumerate(src.shard_samples):
            idx = src.index(shard)
            data = src.shard(shard).data
            for j in range(int(n)):
                entry = idx.sample(j)
                view = memoryview(data)
                sample: dict[str, Any] = {"__key__": entry.pop("__key__")}
                for name, (offset, size) in entry.items():
                    sample[name] = view[offset : offset + size]
                counts[i] = self.decoder.count_tiles(sample)
                del sample, view
                i += 1
        self._counts = counts
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def counts(self) -> np.ndarray:
        """Tiles of each sample, in manifest order."""
        if self._counts is None:
            self._count()
        assert self._counts is not None
        return self._counts

    @property
    def total(self) -> int:
        """Tiles in the dataset."""
        self.counts  # noqa: B018 (counted on first use)
        assert self._starts is not None
        return int(self._starts[-1])

    def shard_counts(self) -> np.ndarray:
        """Tiles of each shard."""
        starts = np.asarray(self.source._starts, dtype=np.int64)
        tile_starts = self._tile_starts()
        return np.diff(tile_starts[starts])

    def _tile_starts(self) -> np.ndarray:
        self.counts  # noqa: B018
        assert self._starts is not None
        return self._starts

    def locate(self, u: int) -> tuple[int, int]:
        """Dataset tile ``u`` → ``(sample index, tile of that sample)``. Raises
        ``IndexError`` outside the dataset."""
        total = self.total
        if u < 0:
            u += total
        if not 0 <= u < total:
            raise IndexError(f"tile {u} of a dataset of {total} tiles")
        starts = self._tile_starts()
        i = int(np.searchsorted(starts, u, side="right")) - 1
        return i, int(u - starts[i])


def tile_index(source: ShardSource, decoder: Any) -> TileIndex | None:
    """The :class:`TileIndex` of a dataset whose decoder serves tiles, else None."""
    return TileIndex(source, decoder) if getattr(decoder, "tiled", False) is True else None
