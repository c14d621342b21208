"""``fastload.cached(dataset)``: make any slow map-style Dataset fast from its 2nd epoch.

The first time item ``i`` is asked for, the wrapped dataset makes it (say, one HTTP
GET per image and a decode); the item is pickled and appended to a tar shard of the
process that made it, and a row ``i → (shard, offset, size, checksum)`` is committed
to a sqlite catalog shared by every process on the node (WAL mode). Afterwards the
item is one read of a local file, checked against its checksum (a row whose bytes
did not reach the disk before a crash is detected and the item made again).

Items must be deterministic for the cache to be right: wrap the slow, deterministic
part and pass random augmentation as ``transform=`` (applied after the cache). The
cache is keyed by ``key`` (default: the dataset's class and length); pass a new key
when the underlying data changes. The cache holds pickles: keep ``cache_dir`` private.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sqlite3
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastload.cache.catalog import connect_wal
from fastload.config import parse_size
from fastload.errors import CacheError, ConfigError
from fastload.shards.checksum import xxh3_128

__all__ = ["CachedDataset", "cached"]

_BLOCK = 512


def cached(
    dataset: Any,
    cache_dir: str | os.PathLike[str],
    *,
    key: str | None = None,
    shard_size: int | str = "256MB",
    transform: Callable[[Any], Any] | None = None,
) -> CachedDataset:
    """Wrap the map-style ``dataset`` so each item is made once and then read from the
    node-local cache in ``cache_dir``; see :class:`CachedDataset`."""
    return CachedDataset(dataset, cache_dir, key=key, shard_size=shard_size, transform=transform)


class CachedDataset:
    """A map-style dataset serving ``dataset``'s items from a local shard cache.

    ``len`` and ``[i]`` behave like the wrapped dataset's (values equal: pickled and
    unpickled). ``stats()`` counts hits, misses and bytes. Works in DataLoader
    workers (each process appends to its own shard). Raises :class:`ConfigError` for
    a dataset without ``__len__``, :class:`CacheError` when the cache is unusable.
    """

    def __init__(
        self,
        dataset: Any,
        cache_dir: str | os.PathLike[str],
        *,
        key: str | None = None,
        shard_size: int | str = "256MB",
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        try:
            n = len(dataset)
        except TypeError:
            raise ConfigError(
                f"fastload.cached needs a map-style dataset with len(); "
                f"{type(dataset).__name__} has none"
            ) from None
        self.dataset = dataset
        self.length = n
        self.transform = transform
        self.shard_size = parse_size(shard_size, "shard_size")
        fingerprint = key or f"{type(dataset).__module__}.{type(dataset).__qualname__}:{n}"
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:20]
        self.root = Path(cache_dir) / "cached" / digest
        self.key = fingerprint
        self._reset()

    # ------------------------------------------------------- process-local state
    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._out: Any = None
        self._out_name = ""
        self._out_size = 0
        self._shard_no = 0
        self._readers: dict[str, Any] = {}
        self._stats = {"hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0, "remade": 0}

    def __getstate__(self) -> dict[str, Any]:
        keep = ("dataset", "length", "transform", "shard_size", "root", "key")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _conn(self) -> sqlite3.Connection:
        if self._pid != os.getpid():
            self._reset()  # forked: the parent's handles are not ours
        if self._db is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                db = connect_wal(self.root / "catalog.sqlite", busy_timeout_s=60.0)
                db.execute(
                    "CREATE TABLE IF NOT EXISTS items (i INTEGER PRIMARY KEY, shard TEXT NOT NULL,"
                    " offset INTEGER NOT NULL, size INTEGER NOT NULL, checksum TEXT NOT NULL)"
                )
                db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
                db.execute("INSERT OR IGNORE INTO meta VALUES ('key', ?)", (self.key,))
            except (OSError, sqlite3.Error) as exc:
                raise CacheError(f"cannot open the item cache in {self.root}: {exc}") from exc
            self._db = db
        return self._db

    # ------------------------------------------------------------------ items
    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        i = int(i)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(f"item {i} out of range for {self.length} items")
        item = self._lookup(i)
        if item is _MISSING:
            item = self.dataset[i]
            self._store(i, item)
        if self.transform is not None:
            item = self.transform(item)
        return item

    def _lookup(self, i: int) -> Any:
        db = self._conn()
        row = db.execute(
            "SELECT shard, offset, size, checksum FROM items WHERE i=?", (i,)
        ).fetchone()
        if row is None:
            self._stats["misses"] += 1
            return _MISSING
        shard, offset, size, checksum = row
        try:
            data = self._read(shard, offset, size)
        except OSError:
            data = b""
        if len(data) != size or xxh3_128(data) != checksum:
            # bytes lost in a crash (or damaged): forget the row, make the item again
            db.execute("DELETE FROM items WHERE i=? AND shard=? AND offset=?", (i, shard, offset))
            self._stats["misses"] += 1
            self._stats["remade"] += 1
            return _MISSING
        self._stats["hits"] += 1
        self._stats["bytes_read"] += size
        return pickle.loads(data)

    def _read(self, shard: str, offset: int, size: int) -> bytes:
        f = self._readers.get(shard)
        if f is None:
            f = open(self.root / shard, "rb")  # noqa: SIM115 - kept open for later reads
            self._readers[shard] = f
        return os.pread(f.fileno(), size, offset)

    def _store(self, i: int, item: Any) -> None:
        try:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CacheError(
                f"item {i} of {type(self.dataset).__name__} cannot be pickled: {exc}"
            ) from exc
        with self._lock:
            out = self._writer(len(data))
            info = tarfile.TarInfo(f"{i:010d}.pkl")
            info.size = len(data)
            info.mode = 0o444
            header = info.tobuf(format=tarfile.PAX_FORMAT)
            offset = self._out_size + len(header)
            out.write(header + data + b"\0" * (-len(data) % _BLOCK))
            out.flush()  # in the OS before the row is visible; the checksum covers the rest
            self._out_size = offset + len(data) + (-len(data) % _BLOCK)
            self._conn().execute(
                "INSERT OR IGNORE INTO items VALUES (?, ?, ?, ?, ?)",
                (i, self._out_name, offset, len(data), xxh3_128(data)),
            )
            self._stats["bytes_written"] += len(data)

    def _writer(self, upcoming: int) -> Any:
        if self._out is not None and self._out_size + upcoming > self.shard_size:
            self._out.close()
            self._out = None
        if self._out is None:
            while True:
                name = f"items-{os.getpid()}-{self._shard_no:05d}.tar"
                self._shard_no += 1
                if not (self.root / name).exists():
                    break
            self._out = open(self.root / name, "ab")  # noqa: SIM115 - closed on roll-over
            self._out_name, self._out_size = name, 0
        return self._out

    # ------------------------------------------------------------------- misc
    def stats(self) -> dict[str, int]:
        """Counters of this process: hits, misses, remade (bad rows), bytes read/written."""
        if self._pid != os.getpid():
            self._reset()  # a forked child starts its own counters
        return dict(self._stats)

    def io_stats(self) -> dict[str, int]:
        """The loader's view of :meth:`stats` (cache hits/misses, disk bytes)."""
        st = self.stats()
        return {
            "cache_hits": st["hits"],
            "cache_misses": st["misses"],
            "disk_bytes": st["bytes_read"],
        }

    def close(self) -> None:
        """Close this process's files and catalog connection."""
        if self._pid != os.getpid():
            self._reset()
            return
        if self._out is not None:
            self._out.close()
        for f in self._readers.values():
            f.close()
        if self._db is not None:
            self._db.close()
        self._reset()

    def __repr__(self) -> str:
        return (
            f"cached({type(self.dataset).__name__}, root={str(self.root)!r}, items={self.length})"
        )


_MISSING = object()
