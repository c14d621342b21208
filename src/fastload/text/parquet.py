"""``ParquetDataset``: existing parquet files, without a conversion step.

Two modes:

* **rows** (no ``tokenizer``): a map-style dataset of rows in file and row order.
  Start-up reads each file's footer only (two ranged reads); a file is fetched the
  first time one of its rows is read, once per node, into the NVMe tier of the
  shared cache (:class:`~fastload.cache.ShardCache`), and read by row group from the
  mapping. The cache addresses entries by content checksum, which a parquet file on
  object storage does not carry: the first process on a node that fetches a file
  records its xxh3-128 in ``<cache_dir>/text/sums/`` (under a lock), every later one
  reads it there.
* **tokens** (``tokenizer=...``): the same windows as :class:`~fastload.TokenDataset`
  over the documents of ``text_field`` (file and row order, EOS after each),
  **tokenized once per node**: the first process on the node writes the token shards
  into ``<cache_dir>/text/tokens/<key>/`` (one process, under a lock; published by a
  directory rename), keyed by each source's URL, size and footer checksum, the
  tokenizer's fingerprint, the field, EOS and dtype. Every later epoch, rank and job
  on the node reads those tokens, and never the parquet files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastload.cache import ShardCache
from fastload.cache.locks import EntryLocks
from fastload.cache.shard_cache import CachedShard
from fastload.config import CacheConfig, FetchConfig
from fastload.errors import ConfigError, MissingDependencyError, ShardFormatError
from fastload.sampling import World
from fastload.shards.checksum import xxh3_128
from fastload.storage import ObjectStore, open_store
from fastload.text.sources import TextSource, list_sources, source_store
from fastload.text.tokens import TokenDataset, TokenSource

__all__ = ["ParquetDataset", "ParquetFile", "ParquetTokenDataset", "scan_parquet"]

_TOKENIZE_DEADLINE_S = 7 * 24 * 3600.0  # another process may tokenize a large corpus
_FOOTER_TAIL = 8


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("pyarrow", "text", "fastload.ParquetDataset") from exc
    return pq


@dataclass(frozen=True)
class ParquetFile:
    """One parquet source: where it is, its size, rows per row group and a checksum
    of its footer (which changes whenever the file's contents do)."""

    root: str
    name: str
    size: int
    row_groups: tuple[int, ...]
    footer_checksum: str

    @property
    def url(self) -> str:
        """The file's URL or local path."""
        return f"{self.root.rstrip('/')}/{self.name}" if self.root else self.name

    @property
    def num_rows(self) -> int:
        """Rows in the file."""
        return int(sum(self.row_groups))


def _metadata_from_footer(footer: bytes, where: str) -> Any:
    pa = __import__("pyarrow")
    pq = _pq()
    if len(footer) < _FOOTER_TAIL or footer[-4:] != b"PAR1":
        raise ShardFormatError("not a parquet file (no PAR1 footer)", where)
    try:
        # the footer alone, framed as a file: pyarrow parses the metadata without the data
        return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    except Exception as exc:
        raise ShardFormatError(f"unreadable parquet footer ({exc})", where) from None


def _scan_one(
    src: TextSource, storage_options: Mapping[str, Any] | None, stores: dict[str, Any] | None
) -> ParquetFile:
    where = src.url
    if not src.root:
        path = src.name.removeprefix("file://")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(max(0, size - _FOOTER_TAIL))
            tail = f.read()
            n = struct.unpack("<I", tail[:4])[0] if len(tail) == _FOOTER_TAIL else 0
            if n + _FOOTER_TAIL > size:
                raise ShardFormatError("not a parquet file (bad footer length)", where)
            f.seek(size - _FOOTER_TAIL - n)
            footer = f.read()
    else:
        store = source_store(src.root, storage_options, stores)
        size = store.size(src.name)
        tail = store.read_range(src.name, max(0, size - _FOOTER_TAIL), size)
        n = struct.unpack("<I", tail[:4])[0] if len(tail) == _FOOTER_TAIL else 0
        if n + _FOOTER_TAIL > size:
            raise ShardFormatError("not a parquet file (bad footer length)", where)
        footer = store.read_range(src.name, size - _FOOTER_TAIL - n, size)
    meta = _metadata_from_footer(footer, where)
    groups = tuple(int(meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    return ParquetFile(src.root, src.name, size, groups, xxh3_128(footer))


def scan_parquet(
    url: str | Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    stores: dict[str, Any] | None = None,
) -> list[ParquetFile]:
    """The parquet files of ``url`` (a file, directory, glob or prefix; or a list), in
    name order, with their footers read. Raises :class:`ShardFormatError` for a file
    that is not parquet, ``SourceDataError`` when nothing matches."""
    sources = [s for s in list_sources(url, storage_options) if s.format == "parquet"]
    if not sources:
        raise ConfigError(f"{url}: no parquet files")
    return [_scan_one(s, storage_options, stores) for s in sources]


@dataclass(frozen=True)
class _Entry:
    """What the cache needs of a parquet file (``ShardLike``)."""

    name: str
    bytes: int
    checksum: str


class _FileCache:
    """Parquet files of one dataset through the shared cache, per process (dropped,
    not closed, after a fork; pickles as its configuration)."""

    def __init__(
        self,
        files: Sequence[ParquetFile],
        storage_options: Mapping[str, Any] | None,
        cache_config: CacheConfig,
        fetch: FetchConfig | None,
        max_open: int = 2,
    ) -> None:
        self.files = list(files)
        self.storage_options = dict(storage_options or {})
        self.cache_config = cache_config
        self.fetch = fetch
        self.max_open = max_open
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._cache: ShardCache | None = None
        self._stores: dict[str, ObjectStore] = {}
        self._open: OrderedDict[int, CachedShard] = OrderedDict()
        self._served = 0

    def __getstate__(self) -> dict[str, Any]:
        keep = ("files", "storage_options", "cache_config", "fetch", "max_open")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    @property
    def cache(self) -> ShardCache:
        self._check_pid()
        if self._cache is None:
            self._cache = ShardCache.from_config(self.cache_config)
        return self._cache

    def store(self, f: ParquetFile) -> ObjectStore:
        self._check_pid()
        store = self._stores.get(f.root)
        if store is None:
            store = open_store(f.root, self.storage_options or None, self.fetch)
            self._stores[f.root] = store
        return store

    def _sum_path(self, f: ParquetFile) -> Path:
        assert self.cache_config.cache_dir is not None
        key = hashlib.sha256(f"{f.url}\0{f.size}\0{f.footer_checksum}".encode()).hexdigest()
        return Path(self.cache_config.cache_dir) / "text" / "sums" / f"{key[:40]}.json"

    def _checksum(self, f: ParquetFile) -> str:
        """The file's content checksum: recorded by the first process on the node that
        fetched it (which fetches it into the cache while computing it)."""
        path = self._sum_path(f)
        with contextlib.suppress(OSError, ValueError, KeyError):
            return str(json.loads(path.read_text())["checksum"])
        path.parent.mkdir(parents=True, exist_ok=True)
        locks = EntryLocks(path.parent)
        deadline = time.monotonic() + self.cache_config.wait_deadline_s
        with locks.hold(path.stem, deadline, f.url):
            with contextlib.suppress(OSError, ValueError, KeyError):
                return str(json.loads(path.read_text())["checksum"])
            tmp_dir = path.parent
            fd, tmp = tempfile.mkstemp(dir=tmp_dir, suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out:
                    self.store(f).download(f.name, out, expected_size=f.size)
                from fastload.shards.checksum import file_checksum

                _, checksum = file_checksum(tmp)

                def copy(dst: Any) -> None:
                    with open(tmp, "rb") as src:
                        shutil.copyfileobj(src, dst, 8 * 2**20)

                self.cache.ensure(_dataset(f), _Entry(f.name, f.size, checksum), copy)
                fd2, tmp_sum = tempfile.mkstemp(dir=tmp_dir, suffix=".json")
                with os.fdopen(fd2, "w") as sums:
                    json.dump({"url": f.url, "size": f.size, "checksum": checksum}, sums)
                os.replace(tmp_sum, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return checksum

    def open(self, k: int) -> memoryview:
        """The bytes of file ``k`` (mapped from the node cache, or held in RAM)."""
        self._check_pid()
        with self._lock:
            cached = self._open.get(k)
            if cached is not None:
                self._open.move_to_end(k)
                return cached.data
        f = self.files[k]
        if not f.root:  # a local file: mapped where it is
            import mmap

            with open(f.name.removeprefix("file://"), "rb") as fh:
                mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            cached = CachedShard(None, memoryview(mapping), Path(f.name), None, mapping)  # type: ignore[arg-type]
        elif self.cache_config.cache_dir is None:
            data = self.store(f).read(f.name)
            cached = CachedShard(None, memoryview(data), None)  # type: ignore[arg-type]
        else:
            entry = _Entry(f.name, f.size, self._checksum(f))
            store = self.store(f)

            def fetch(out: Any) -> None:
                store.download(f.name, out, expected_size=f.size)

            cached = self.cache.open_shard(_dataset(f), entry, fetch)
        with self._lock:
            self._open[k] = cached
            while len(self._open) > self.max_open:
                _, old = self._open.popitem(last=False)
                old.close()
        return cached.data

    def remote_bytes(self) -> int:
        self._check_pid()
        return int(sum(s.stats().bytes_read for s in self._stores.values()))

    def close(self) -> None:
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            while self._open:
                _, cached = self._open.popitem()
                cached.close()
        if self._cache is not None:
            self._cache.close()
            self._cache = None


def _dataset(f: ParquetFile) -> str:
    return f.root.rstrip("/") or "file://"


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
        self._files = _FileCache(self.files, storage_options, config, fetch)
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
            pf = _pq().ParquetFile(pa.BufferReader(pa.py_buffer(data)))
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


class _LocalTokenSource(TokenSource):
    """Token shards published in the node's cache directory: mapped in place (they
    were verified when written), not copied into the disk tier again."""

    def shard(self, shard: int) -> CachedShard:
        self._check_pid()
        with self._lock:
            cached = self._open.get(shard)
            if cached is not None:
                self._open.move_to_end(shard)
                return cached
        import mmap

        info = self.manifest.shards[shard]
        path = Path(self.url.removeprefix("file://")) / info.name
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cached = CachedShard(self.cache.key(self.dataset_id, info), memoryview(mapping), path,
                             None, mapping)  # fmt: skip
        with self._lock:
            self._open[shard] = cached
            while len(self._open) > self.max_open_shards:
                _, old = self._open.popitem(last=False)
                old.close()
        return cached

    def prefetch(self, shards: Sequence[int]) -> None:
        """Nothing to stage: the shards are local files."""


class ParquetTokenDataset(TokenDataset):
    """:class:`~fastload.TokenDataset` windows over parquet documents tokenized once per
    node (see :class:`ParquetDataset`). ``source_remote_bytes()`` counts the bytes
    this process read from the parquet files' store (0 once the tokens exist)."""

    def __init__(
        self,
        url: str | Sequence[str],
        columns: Sequence[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        tokenizer: Any,
        text_field: str = "text",
        seq_len: int | None = None,
        eos_id: int | None = None,
        dtype: str = "auto",
        shuffle: bool = False,
        seed: int = 0,
        world: World | None = None,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        drop_last: bool = False,
        shard_size: int | str = "256MB",
        progress: bool = False,
        **kwargs: Any,
    ) -> None:
        from fastload.text.sources import (
            eos_id_of,
            load_tokenizer,
            token_dtype,
            tokenizer_fingerprint,
        )

        del columns, cache_limit  # the token shards live beside the disk tier
        if seq_len is None:
            raise ConfigError("ParquetDataset(tokenizer=...) needs seq_len")
        if cache_dir is None:
            raise ConfigError("ParquetDataset(tokenizer=...) needs cache_dir (the node cache)")
        self.source_stores: dict[str, ObjectStore] = {}
        files = scan_parquet(url, storage_options, self.source_stores)
        tok = load_tokenizer(tokenizer)
        tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
        eos = eos_id_of(tok, eos_id, tok_path)
        np_dtype = token_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))
        key_doc = {
            "files": [[f.url, f.size, f.footer_checksum] for f in files],
            "tokenizer": tokenizer_fingerprint(tok),
            "field": text_field,
            "eos_id": eos,
            "dtype": np_dtype.name,
        }
        key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:40]
        root = Path(os.fspath(cache_dir)) / "text" / "tokens"
        self.token_dir = root / key
        self.tokenized_here = False
        if not (self.token_dir / "manifest.json").exists():
            self._tokenize(files, root, key, tok, text_field, eos, np_dtype.name, shard_size,
                           storage_options, progress)  # fmt: skip
        source = _LocalTokenSource(str(self.token_dir), max_open_shards=6)
        super().__init__(
            str(self.token_dir), seq_len, shuffle=shuffle, seed=seed, world=world,
            position_ids=position_ids, cu_seqlens=cu_seqlens, drop_last=drop_last,
            source=source, **kwargs,
        )  # fmt: skip
        self.files = files

    def _tokenize(
        self,
        files: list[ParquetFile],
        root: Path,
        key: str,
        tok: Any,
        field: str,
        eos: int,
        dtype: str,
        shard_size: int | str,
        storage_options: Mapping[str, Any] | None,
        progress: bool,
    ) -> None:
        from fastload.text.sources import text

        root.mkdir(parents=True, exist_ok=True)
        locks = EntryLocks(root)
        with locks.hold(key, time.monotonic() + _TOKENIZE_DEADLINE_S, f"tokens of {key}"):
            if (self.token_dir / "manifest.json").exists():
                return  # another process on the node did it while we waited
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
            try:
                text([f.url for f in files], str(tmp / "ds"), tok, field=field, eos_id=eos,
                     dtype=dtype, shard_size=shard_size, storage_options=storage_options,
                     progress=progress, stores=self.source_stores)  # fmt: skip
                os.replace(tmp / "ds", self.token_dir)
                self.tokenized_here = True
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def source_remote_bytes(self) -> int:
        """Bytes this process fetched from the parquet files' store(s), counted by
        their :class:`~fastload.storage.ObjectStore`: footers at start-up, and the
        whole files when it tokenized them (nothing once the node has the tokens)."""
        return int(sum(s.stats().bytes_read for s in self.source_stores.values()))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["source_stores"] = {}  # counters are per process
        return state
