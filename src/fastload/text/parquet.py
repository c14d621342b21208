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

import inspect
import os
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.text.parquet_files import (
    DEFAULT_PATTERN,
    ParquetFile,
    ParquetFileCache,
    pyarrow_parquet,
    scan_parquet,
)

__all__ = ["ParquetDataset", "ParquetFile", "scan_parquet"]


class ParquetDataset:
    """The rows of existing parquet files, map-style.

    ``url``: a parquet file, directory, glob or prefix (or a list), files in name
    order, those whose name matches ``pattern`` (default ``*.parquet``). ``len(ds)``
    rows, ``ds[i]`` a dict of ``columns`` (all by default) as
    pyarrow gives them; order, shuffling and the rank split come from
    :class:`fastload.DataLoader` (``shuffle=``, ``seed=``). Remote files go through
    the node cache at ``cache_dir`` (capped at ``cache_limit``) when one is given,
    else they are read into RAM; ``cache_dir``, ``cache_limit`` and ``ram_limit``
    combine with ``cache_config`` by :meth:`~fastload.CacheConfig.with_arguments`.
    Everything but ``url`` is passed by keyword.

    Token windows of parquet documents are :class:`~fastload.ParquetTokenDataset`
    (``ParquetDataset(..., tokenizer=...)`` still returns one, with a
    :class:`DeprecationWarning`, for one release). Raises :class:`ConfigError` on bad
    arguments, :class:`ShardFormatError` for a file that is not parquet.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the deprecated spelling of ParquetTokenDataset (one release); every other
        # call is a rows dataset, its arguments checked by __init__'s signature
        # (unpickling calls __new__ without arguments)
        if cls is ParquetDataset and kwargs.get("tokenizer") is not None:
            return _token_dataset(args, kwargs)
        return super().__new__(cls)

    @keyword_only("columns", "cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str | Sequence[str],
        *,
        columns: Sequence[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        pattern: str = DEFAULT_PATTERN,
    ) -> None:
        config = (cache_config or CacheConfig()).with_arguments(
            cache_dir=cache_dir, cache_limit=cache_limit, ram_limit=ram_limit
        )
        self.url = url
        self.files = scan_parquet(url, storage_options, pattern=pattern)
        self.columns = None if columns is None else list(columns)
        self.cache_dir = config.cache_dir
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


# inspect.signature would show __new__'s (*args, **kwargs): show __init__'s
_INIT = inspect.signature(ParquetDataset.__init__)
ParquetDataset.__signature__ = _INIT.replace(  # type: ignore[attr-defined]
    parameters=list(_INIT.parameters.values())[1:]
)

# the old positional order of ParquetDataset(url, columns, cache_dir, cache_limit,
# storage_options, *, tokenizer=...)
_OLD_POSITIONAL = ("columns", "cache_dir", "cache_limit", "storage_options")


def _token_dataset(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ParquetDataset(..., tokenizer=...)``: a ParquetTokenDataset, with a
    DeprecationWarning. ``columns`` and ``cache_limit`` (which token windows never
    used) are accepted only when None; any other argument the new class does not
    take is its TypeError."""
    from fastload.text.parquet_tokens import ParquetTokenDataset

    warnings.warn(
        "ParquetDataset(..., tokenizer=...) is deprecated and stops working in the next "
        "release; write ParquetTokenDataset(url, tokenizer=..., seq_len=..., cache_dir=...)",
        DeprecationWarning,
        stacklevel=3,
    )
    url, rest = args[:1], args[1:]
    if len(rest) > len(_OLD_POSITIONAL):
        raise TypeError(
            f"ParquetDataset() takes 1 to {1 + len(_OLD_POSITIONAL)} positional arguments "
            f"but {len(args)} were given"
        )
    for name, value in zip(_OLD_POSITIONAL, rest, strict=False):
        if name in kwargs:
            raise TypeError(f"ParquetDataset() got multiple values for argument {name!r}")
        kwargs[name] = value
    for name in ("columns", "cache_limit"):
        if name in kwargs and kwargs[name] is None:
            del kwargs[name]
    return ParquetTokenDataset(*url, **kwargs)
