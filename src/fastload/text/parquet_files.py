"""Parquet files as sources: their footers (:func:`scan_parquet`, two ranged reads a
file) and the files themselves through the node cache (:class:`ParquetFileCache`).

The cache addresses entries by content checksum, which a parquet file on object
storage does not carry: the first process on a node that fetches a file records its
xxh3-128 in ``<cache_dir>/text/sums/`` (under a lock), every later one reads it there.
"""

from __future__ import annotations

import contextlib
import fnmatch
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

from fastload.cache import ShardCache
from fastload.cache.locks import EntryLocks
from fastload.cache.shard_cache import CachedShard
from fastload.config import CacheConfig, FetchConfig
from fastload.errors import ConfigError, MissingDependencyError, ShardFormatError
from fastload.shards.checksum import xxh3_128
from fastload.storage import ObjectStore, open_store
from fastload.text.sources import TextSource, list_sources, source_store

__all__ = ["DEFAULT_PATTERN", "ParquetFile", "ParquetFileCache", "pyarrow_parquet", "scan_parquet"]

_FOOTER_TAIL = 8
#: The data files a directory, glob or prefix contributes, by default.
DEFAULT_PATTERN = "*.parquet"


def pyarrow_parquet() -> Any:
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
    columns: tuple[str, ...] = ()

    @property
    def canonical_url(self) -> str:
        """The file's URL with a local path made absolute and resolved (a relative and
        an absolute path to the same file give the same key)."""
        if self.root:
            return self.url
        return os.path.realpath(self.name.removeprefix("file://"))

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
    pq = pyarrow_parquet()
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
    try:
        columns = tuple(meta.schema.to_arrow_schema().names)
    except Exception:  # a schema arrow cannot map: the reader names the problem later
        columns = ()
    return ParquetFile(src.root, src.name, size, groups, xxh3_128(footer), columns)


def scan_parquet(
    url: str | Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    stores: dict[str, Any] | None = None,
    pattern: str = DEFAULT_PATTERN,
) -> list[ParquetFile]:
    """The parquet files of ``url`` (a file, directory, glob or prefix; or a list), in
    name order, with their footers read: the files whose base name matches
    ``pattern`` (a glob; by default the ``.parquet`` extension), so a
    ``tokenizer.json`` or README beside the data is never read as data. Raises
    :class:`ShardFormatError` for a file that is not parquet, :class:`ConfigError`
    when no file matches."""
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"pattern must be a non-empty glob such as '*.parquet', got {pattern!r}")
    sources = [
        s
        for s in list_sources(url, storage_options)
        if fnmatch.fnmatchcase(s.name.rsplit("/", 1)[-1], pattern)
    ]
    if not sources:
        raise ConfigError(f"{url}: no parquet files (no file name matches {pattern!r})")
    return [_scan_one(s, storage_options, stores) for s in sources]


@dataclass(frozen=True)
class _Entry:
    """What the cache needs of a parquet file (``ShardLike``)."""

    name: str
    bytes: int
    checksum: str


class ParquetFileCache:
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
        with self._lock:
            if self._cache is None:
                self._cache = ShardCache.from_config(self.cache_config)
            return self._cache

    def store(self, f: ParquetFile) -> ObjectStore:
        self._check_pid()
        with self._lock:  # one store per root, or a racing thread's bytes go uncounted
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

                self.cache.ensure(cache_dataset(f), _Entry(f.name, f.size, checksum), copy)
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

            cached = self.cache.open_shard(cache_dataset(f), entry, fetch)
        with self._lock:
            raced = self._open.get(k)
            if raced is not None:  # another thread opened it meanwhile: keep one
                cached.close()
                self._open.move_to_end(k)
                return raced.data
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


def cache_dataset(f: ParquetFile) -> str:
    return f.root.rstrip("/") or "file://"
