"""``ParquetDataset``: the rows of existing parquet files, without a conversion step.

A map-style dataset of rows in file and row order. Start-up reads each file's footer
only (two ranged reads); a file is fetched the first time one of its rows is read,
once per node, into the NVMe tier of the shared cache
(:class:`~fastload.cache.ShardCache`), and read by row group from the mapping
(:mod:`fastload.text.parquet_files`). Token windows of the same files, tokenized once
per node, are :class:`~fastload.ParquetTokenDataset`
(:mod:`fastload.text.parquet_tokens`).
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastload.config import CacheConfig, FetchConfig
from fastload.sampling import World
from fastload.text.parquet_files import (
    ParquetFile,
    ParquetFileCache,
    pyarrow_parquet,
    scan_parquet,
)

__all__ = ["ParquetDataset", "ParquetFile", "scan_parquet"]


class ParquetDataset:
    """Rows (or, with ``tokenizer``, token windows) of existing parquet files.

    ``url``: a parquet file, directory, glob or prefix (or a list), files in name
    order. Without ``tokenizer``: map-style, ``len(ds)`` rows, ``ds[i]`` a dict of
    ``columns`` (all by default) as pyarrow gives them; order, shuffling and the
    rank split come from :class:`fastload.DataLoader` (``shuffle=``, ``seed=``).

    With ``tokenizer`` (a ``tokenizer.json`` path or ``tokenizers.Tokenizer``) and
    ``seq_len``: a :class:`ParquetTokenDataset`, the iterable of
    :class:`~fastload.TokenDataset` windows over ``text_field`` tokenized once per
    node into ``cache_dir`` (required), with ``shuffle``/``seed``/``world`` and resume
    as for TokenDataset. Raises :class:`ConfigError` on bad arguments,
    :class:`ShardFormatError` for a file that is not parquet.
    """

    def __new__(cls, *args: Any, tokenizer: Any = None, **kwargs: Any) -> Any:
        # (unpickling calls __new__ without arguments: a rows dataset then)
        if tokenizer is not None:
            from fastload.text.parquet_tokens import ParquetTokenDataset

            return ParquetTokenDataset(*args, tokenizer=tokenizer, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | Sequence[str],
        columns: Sequence[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        tokenizer: Any = None,
        text_field: str = "text",
        seq_len: int | None = None,
        eos_id: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        world: World | None = None,
        ram_limit: int | str = 2 * 10**9,
        fetch: FetchConfig | None = None,
        cache_config: CacheConfig | None = None,
    ) -> None:
        del tokenizer, text_field, seq_len, eos_id, shuffle, seed, world  # tokens mode only
        self.url = url
        self.files = scan_parquet(url, storage_options)
        self.columns = None if columns is None else list(columns)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        config = CacheConfig(cache_dir=self.cache_dir, cache_limit=cache_limit, ram_limit=ram_limit)
        if cache_config is not None:
            config = dataclasses.replace(
                cache_config, cache_dir=self.cache_dir, cache_limit=cache_limit, ram_limit=ram_limit
            )
        self._files = ParquetFileCache(self.files, storage_options, config, fetch)
        rows = [f.num_rows for f in self.files]
        self._file_starts = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(rows, out=self._file_starts[1:])
        self._group_starts = [np.concatenate([[0], np.cumsum(f.row_groups)]) for f in self.files]
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._groups: OrderedDict[tuple[int, int], list[dict[str, Any]]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_groups", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return int(self._file_starts[-1])

    def locate(self, i: int) -> tuple[int, int, int]:
        """Row ``i`` → (file, row group, row within the group). Raises IndexError."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows of {self.url}")
        k = int(np.searchsorted(self._file_starts, i, side="right")) - 1
        r = i - int(self._file_starts[k])
        starts = self._group_starts[k]
        g = int(np.searchsorted(starts, r, side="right")) - 1
        return k, g, r - int(starts[g])

    def _row_group(self, k: int, g: int) -> list[dict[str, Any]]:
        if self._pid != os.getpid():
            self._reset()
        rows = self._groups.get((k, g))
        if rows is None:
            pa = __import__("pyarrow")
            data = self._files.open(k)
            pf = pyarrow_parquet().ParquetFile(pa.BufferReader(pa.py_buffer(data)))
            table = pf.read_row_group(g, columns=self.columns)
            rows = table.to_pylist()
            self._groups[(k, g)] = rows
            while len(self._groups) > 2:
                self._groups.popitem(last=False)
        else:
            self._groups.move_to_end((k, g))
        return rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, g, j = self.locate(int(i))
        return self._row_group(k, g)[j]

    def io_stats(self) -> dict[str, int]:
        """Bytes fetched from the store by this process."""
        return {"remote_bytes": self._files.remote_bytes()}

    def close(self) -> None:
        """Release mapped files and the cache's handles of this process."""
        self._files.close()

    def __repr__(self) -> str:
        return f"ParquetDataset({self.url!r}, files={len(self.files)}, rows={len(self)})"
