"""``fastload.cached(dataset)``: make any slow map-style Dataset fast from its 2nd epoch.

The first time item ``i`` is asked for, the wrapped dataset makes it (say, one HTTP
GET per image and a decode); the item is pickled and appended to a tar shard of the
process that made it, and a row ``i → (shard, offset, size, mac)`` is committed to a
sqlite catalog shared by every process on the node (WAL mode). Afterwards the item is
one read of a local file.

Unpickling runs code, so an item is unpickled only after its HMAC-SHA256 checks out:
the key lives outside ``cache_dir`` (``<config dir>/cached-items.key``, see
:func:`fastload.config.default_config_dir`, created 0600), and the MAC covers the
cache's identity, the item's index and its bytes. A row that anyone else wrote or
changed (or whose bytes did not reach the disk before a crash) fails the check, is
forgotten and the item made again; it is never unpickled. The directories are made
0700 and the files 0600 whatever the umask, and a directory owned by another user or
writable by others is refused (:class:`~fastload.errors.UnsafePathError`); files are
opened without following symlinks. ``shared=True`` is the opt-in for a group that
trusts itself (see ``docs/security.md``).

Items must be deterministic for the cache to be right: wrap the slow, deterministic
part and pass random augmentation as ``transform=`` (applied after the cache). The
cache is keyed by a fingerprint of the wrapped dataset (its class, length and state:
its arguments), so a dataset built with other arguments gets its own items; state
that cannot be fingerprinted is named in a :class:`CacheKeyWarning`. Pass ``key=``
to name the data yourself (and a new key when the data changes).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import re
import secrets
import shutil
import sqlite3
import stat
import tarfile
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastload._args import keyword_only
from fastload._fs import UnsafePathError, check_dir, check_file, make_dirs, open_nofollow
from fastload.cache import external
from fastload.cache.catalog import BUSY_SLICE_S, connect_wal, execute, set_busy_timeout
from fastload.config import default_config_dir, parse_size
from fastload.datasets._fingerprint import fingerprint
from fastload.errors import CacheError, ConfigError

__all__ = [
    "CacheKeyWarning",
    "CachedDataset",
    "ItemCacheInfo",
    "cached",
    "clear_item_caches",
    "item_caches",
    "item_key",
]

_BLOCK = 512
_HEADER_ROOM = 2048  # a PAX header and the padding after an item
_MAC = "hmac-sha256:"
_KEY_BYTES = 32
KEY_NAME = "cached-items.key"
_SHARD_RE = re.compile(r"^items-[0-9]{1,10}-[0-9]{5,10}\.tar$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{20}$")
#: How long a statement waits for the item catalog's lock (held by a process stopped or
#: hung inside a write) before :class:`CacheError`: in slices, so Ctrl-C acts meanwhile.
_BUSY_TIMEOUT_S = 60.0


class CacheKeyWarning(UserWarning):
    """``fastload.cached`` could not fingerprint part of the wrapped dataset: a change
    there would not be noticed, and old items would be served. Pass ``key=``."""


class CachedDataset:
    """A map-style dataset serving ``dataset``'s items from a local shard cache.

    ``len`` and ``[i]`` behave like the wrapped dataset's (values equal: pickled and
    unpickled). ``stats()`` counts hits, misses, remade (refused) items and bytes.
    Works in DataLoader workers (each process appends to its own shard). ``key``
    names the data (default: a fingerprint of ``dataset``); ``shared`` lets a group
    share the directory (modes 2770/0660, other owners allowed); ``key_file`` is the
    item-authentication key (default ``<config dir>/cached-items.key``; processes
    that share items need the same key). Raises :class:`ConfigError` for a dataset
    without ``__len__``, :class:`~fastload.errors.UnsafePathError` for a cache directory
    or key another user controls, :class:`CacheError` when the cache is unusable.
    """

    @keyword_only("cache_dir")
    def __init__(
        self,
        dataset: Any,
        *,
        cache_dir: str | os.PathLike[str],
        key: str | None = None,
        shard_size: int | str = "256MB",
        transform: Callable[[Any], Any] | None = None,
        shared: bool = False,
        key_file: str | os.PathLike[str] | None = None,
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
        self.shared = bool(shared)
        self.key_file = None if key_file is None else os.fspath(key_file)
        if key is None:
            digest, problems = fingerprint(dataset)
            key = f"{type(dataset).__module__}.{type(dataset).__qualname__}:{n}:{digest}"
            if problems:
                shown = "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")
                warnings.warn(
                    f"fastload.cached: cannot fingerprint part of {type(dataset).__name__} "
                    f"({shown}); a change there would not be noticed and old items would be "
                    "served: pass key='<name and version of the data>'",
                    CacheKeyWarning,
                    stacklevel=3,
                )
        self.key = key
        self.cache_dir = Path(os.path.expanduser(os.fspath(cache_dir)))
        self.root = self.cache_dir / "cached" / _root_digest(key)
        self._reset()

    # ------------------------------------------------------- process-local state
    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._mac_key: bytes | None = None
        self._out: Any = None
        self._out_name = ""
        self._out_size = 0
        self._shard_no = 0
        self._readers: dict[str, int] = {}
        self._pins: dict[str, Any] = {}  # shard -> ExternalPin, while its fd is open
        self._reservation: Any = None  # the cap's reservation of the shard written
        self._no_room = False
        self._stats = {
            "hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0, "remade": 0,
            "no_room": 0,
        }  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        # the MAC key is not carried: each process reads it from its file
        keep = (
            "dataset", "length", "transform", "shard_size", "shared", "key_file", "key",
            "cache_dir", "root",
        )  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _conn(self) -> sqlite3.Connection:
        if self._pid != os.getpid():
            self._reset()  # forked: the parent's handles are not ours
        if self._db is None:
            self._mac_key = item_key(self.key_file, shared=self.shared)
            make_dirs(self.root, top=self.cache_dir, shared=self.shared)
            catalog = self.root / "catalog.sqlite"
            try:
                # created here with our mode (sqlite gives -wal/-shm the same one)
                fd = open_nofollow(catalog, os.O_RDWR | os.O_CREAT, shared=self.shared)
                os.close(fd)
                db = connect_wal(catalog, busy_timeout_s=_BUSY_TIMEOUT_S)
            except (OSError, sqlite3.Error) as exc:
                if isinstance(exc, UnsafePathError):
                    raise
                raise CacheError(f"cannot open the item cache in {self.root}: {exc}") from exc
            try:
                # every statement waits for a lock in slices (see _sql)
                set_busy_timeout(db, BUSY_SLICE_S)
                self._db = db
                self._sql(
                    "CREATE TABLE IF NOT EXISTS items (i INTEGER PRIMARY KEY, shard TEXT NOT NULL,"
                    " offset INTEGER NOT NULL, size INTEGER NOT NULL, checksum TEXT NOT NULL)"
                )
                self._sql("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
                self._sql("INSERT OR IGNORE INTO meta VALUES ('key', ?)", (self.key,))
            except BaseException as exc:  # an interrupt too: the connection is not kept
                self._db = None
                db.close()
                if isinstance(exc, sqlite3.Error):
                    raise CacheError(f"cannot open the item cache in {self.root}: {exc}") from exc
                raise
        return self._db

    def _sql(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """Run one statement on the item catalog. A lock held by another process (one
        stopped or hung inside a write) is waited for in short slices, so Ctrl-C and
        signal handlers act; past :data:`_BUSY_TIMEOUT_S` (and for any other sqlite
        failure) a :class:`CacheError` names the item cache."""
        assert self._db is not None
        return execute(
            self._db,
            sql,
            params,
            timeout_s=_BUSY_TIMEOUT_S,
            where=f"the item cache in {self.root}",
        )

    def _mac(self, i: int, data: bytes) -> str:
        assert self._mac_key is not None
        h = hmac.new(self._mac_key, digestmod="sha256")
        h.update(self.root.name.encode() + b"\0" + i.to_bytes(8, "little"))
        h.update(data)
        return _MAC + h.hexdigest()

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
        self._conn()
        row = self._sql(
            "SELECT shard, offset, size, checksum FROM items WHERE i=?", (i,)
        ).fetchone()
        if row is None:
            self._stats["misses"] += 1
            return _MISSING
        shard, offset, size, mac = row
        data = self._read(shard, offset, size)
        stored = str(mac).encode("utf-8", "surrogatepass")  # a row may hold any text
        if data is None or not hmac.compare_digest(stored, self._mac(i, data).encode()):
            # written by someone without our key, damaged, or lost in a crash: never
            # unpickled; forget the row and make the item again
            self._sql("DELETE FROM items WHERE i=? AND shard=? AND offset=?", (i, shard, offset))
            self._stats["misses"] += 1
            self._stats["remade"] += 1
            return _MISSING
        self._stats["hits"] += 1
        self._stats["bytes_read"] += size
        return pickle.loads(data)

    def _read(self, shard: Any, offset: Any, size: Any) -> bytes | None:
        """The bytes a row points at, or None when the row is not one we could have
        written (a name of another shape, a range outside the file, a symlink)."""
        if not (
            isinstance(shard, str)
            and _SHARD_RE.match(shard)
            and isinstance(offset, int)
            and isinstance(size, int)
            and offset >= 0
            and size >= 0
        ):
            return None
        try:
            fd = self._readers.get(shard)
            if fd is None:
                # pinned while open: the cap's eviction skips it (an evicted shard's
                # items are gone, and made again)
                held = external.pin(self._tier(), "items", self.root / shard)
                if held is None:
                    return None
                try:
                    fd = open_nofollow(self.root / shard, os.O_RDONLY, shared=self.shared)
                except BaseException:
                    held.release()
                    raise
                self._readers[shard] = fd
                self._pins[shard] = held
            if offset + size > os.fstat(fd).st_size:
                return None  # never allocate more than the file holds
            data = os.pread(fd, size, offset)
        except (OSError, CacheError):
            return None
        return data if len(data) == size else None

    def _store(self, i: int, item: Any) -> None:
        try:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CacheError(
                f"item {i} of {type(self.dataset).__name__} cannot be pickled: {exc}"
            ) from exc
        with self._lock:
            out = self._writer(len(data) + _HEADER_ROOM)
            if out is None:
                # no room under the cache's cap: served, not kept
                self._stats["no_room"] += 1
                return
            info = tarfile.TarInfo(f"{i:010d}.pkl")
            info.size = len(data)
            info.mode = 0o444
            header = info.tobuf(format=tarfile.PAX_FORMAT)
            offset = self._out_size + len(header)
            out.write(header + data + b"\0" * (-len(data) % _BLOCK))
            out.flush()  # in the OS before the row is visible; the MAC covers the rest
            self._out_size = offset + len(data) + (-len(data) % _BLOCK)
            self._conn()
            row = self._sql("SELECT 1 FROM items WHERE i=?", (i,)).fetchone()
            if row is None:
                self._sql(
                    "INSERT OR IGNORE INTO items VALUES (?, ?, ?, ?, ?)",
                    (i, self._out_name, offset, len(data), self._mac(i, data)),
                )
            self._stats["bytes_written"] += len(data)

    def _writer(self, upcoming: int) -> Any:
        if self._out is not None and self._out_size + upcoming > self._reserved():
            self._seal()
        if self._out is None:
            while True:
                name = f"items-{os.getpid()}-{self._shard_no:05d}.tar"
                self._shard_no += 1
                if os.path.lexists(self.root / name):
                    continue  # a peer's (another PID namespace), or planted
                try:
                    # its full size under the cache's cap before a byte is written
                    reservation = external.FileReservation.open(
                        self._tier(), "items", self.root / name, max(self.shard_size, upcoming)
                    )
                except FileExistsError:
                    continue  # a peer with the same PID writes it
                if reservation is None:
                    return None
                try:
                    # O_EXCL|O_NOFOLLOW: a name taken (by a peer in another PID
                    # namespace, or a planted symlink) is skipped, never opened
                    fd = open_nofollow(
                        self.root / name,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                        shared=self.shared,
                    )
                except (FileExistsError, UnsafePathError):
                    reservation.cancel()
                    continue
                except OSError as exc:
                    reservation.cancel()
                    raise CacheError(f"cannot create {self.root / name}: {exc}") from exc
                self._reservation = reservation
                break
            self._out = os.fdopen(fd, "ab")
            self._out_name, self._out_size = name, 0
        return self._out

    def _tier(self) -> Any:
        return external.tier_for(self.cache_dir, shared=self.shared)

    def _reserved(self) -> int:
        r = self._reservation
        return self.shard_size if r is None else int(r.size)

    def _seal(self) -> None:
        """Close the shard being written and seal its reservation at its size."""
        out, self._out = self._out, None
        if out is not None:
            out.close()
        r, self._reservation = self._reservation, None
        if r is not None:
            with contextlib.suppress(CacheError):
                r.seal()  # unsealed, its reservation and file are reclaimed later

    # ------------------------------------------------------------------- misc
    def stats(self) -> dict[str, int]:
        """Counters of this process: hits, misses, remade (refused rows), bytes read/written."""
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
        self._seal()
        for fd in self._readers.values():
            os.close(fd)
        for held in self._pins.values():
            held.release()
        if self._db is not None:
            self._db.close()
        self._reset()

    def __repr__(self) -> str:
        return (
            f"cached({type(self.dataset).__name__}, root={str(self.root)!r}, items={self.length})"
        )


_MISSING = object()


def _root_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]


# ------------------------------------------------------------------ the item key
def item_key(key_file: str | os.PathLike[str] | None = None, *, shared: bool = False) -> bytes:
    """The key that authenticates cached items: read from ``key_file`` (default
    ``<config dir>/cached-items.key``), created there (32 random bytes, mode 0600, in
    a 0700 directory) when absent. The file must be a regular file owned by the
    current user (any owner with ``shared``) that others cannot read or write
    (nor the group, unless ``shared``). Raises
    :class:`~fastload.errors.UnsafePathError` otherwise."""
    if key_file is not None:
        try:
            return _read_key(Path(key_file), shared, follow=True)
        except OSError as exc:
            raise CacheError(f"cannot read the item key {key_file}: {exc}") from exc
    path = Path(default_config_dir()) / KEY_NAME
    try:
        make_dirs(path.parent)
        try:
            return _read_key(path, shared, follow=False)
        except FileNotFoundError:
            pass
        fd, tmp = tempfile.mkstemp(prefix=".key-", dir=path.parent)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        return _read_key(path, shared, follow=False)
    except CacheError as exc:
        if isinstance(exc, UnsafePathError):
            raise
        raise CacheError(
            f"{exc}; fastload.cached needs a writable config directory for its item key: "
            "set FASTLOAD_CONFIG_DIR or pass key_file="
        ) from exc
    except OSError as exc:
        raise CacheError(
            f"cannot make the item key {path}: {exc}; fastload.cached needs a writable "
            "config directory for it: set FASTLOAD_CONFIG_DIR or pass key_file="
        ) from exc


def _read_key(path: Path, shared: bool, follow: bool) -> bytes:
    flags = os.O_RDONLY | os.O_CLOEXEC
    if follow:
        # an explicit key file may be a mounted secret (symlinks in a projected volume)
        fd = os.open(path, flags)
    else:
        fd = open_nofollow(path, os.O_RDONLY, shared=shared, check=False)
    try:
        st = check_file(fd, path, shared=shared)
        readable = stat.S_IROTH | (0 if shared else stat.S_IRGRP)
        if st.st_mode & readable:
            raise UnsafePathError(
                f"{path}: the key that authenticates cached items is readable by other "
                f"users (mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`"
            )
        data = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != _KEY_BYTES:
        raise CacheError(
            f"{path}: not a fastload item key ({len(data)} bytes, want {_KEY_BYTES}); delete "
            "it to make a new one (cached items are then made again)"
        )
    return data


# ------------------------------------------------------------ stats and clear
@dataclass(frozen=True)
class ItemCacheInfo:
    """One ``fastload.cached`` item cache under ``cache_dir/cached/``: its directory
    name, the key it was made with, its item count and bytes, and the reason it was
    not read (``None`` when it was)."""

    name: str
    key: str | None
    items: int
    bytes: int
    problem: str | None = None


def _cached_dir(cache_dir: str | os.PathLike[str]) -> Path:
    return Path(os.path.expanduser(os.fspath(cache_dir))) / "cached"


def _tree_bytes(path: Path) -> int:
    total = 0
    with os.scandir(path) as it:
        for e in it:
            if e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


def item_caches(cache_dir: str | os.PathLike[str], *, shared: bool = False) -> list[ItemCacheInfo]:
    """The ``fastload.cached`` item caches in ``cache_dir`` (for ``fastload cache
    stats``), sorted by name. A directory that fails the trust checks is listed with
    its ``problem`` and not opened."""
    base = _cached_dir(cache_dir)
    if not os.path.isdir(base):
        return []
    out: list[ItemCacheInfo] = []
    for name in sorted(os.listdir(base)):
        path = base / name
        try:
            check_dir(base, shared=shared)
            check_dir(path, shared=shared)
        except (UnsafePathError, FileNotFoundError) as exc:
            out.append(ItemCacheInfo(name, None, 0, 0, str(exc)))
            continue
        key, items = None, 0
        try:
            uri = f"file:{quote(str(path / 'catalog.sqlite'))}?mode=ro"
            fd = open_nofollow(path / "catalog.sqlite", os.O_RDONLY, shared=shared)
            os.close(fd)
            # a lock held by a stopped writer is waited for in slices (Ctrl-C acts)
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=BUSY_SLICE_S)) as db:
                where = f"the item cache in {path}"
                row = execute(db, "SELECT v FROM meta WHERE k='key'", timeout_s=5.0, where=where)
                first = row.fetchone()
                key = None if first is None else str(first[0])
                count = execute(db, "SELECT COUNT(*) FROM items", timeout_s=5.0, where=where)
                items = int(count.fetchone()[0])
        except (OSError, CacheError, sqlite3.Error) as exc:
            out.append(ItemCacheInfo(name, None, 0, _tree_bytes(path), f"unreadable: {exc}"))
            continue
        out.append(ItemCacheInfo(name, key, items, _tree_bytes(path)))
    return out


def clear_item_caches(
    cache_dir: str | os.PathLike[str], *, shared: bool = False
) -> tuple[int, int]:
    """Delete every ``fastload.cached`` item cache in ``cache_dir`` (for ``fastload
    cache clear``); returns ``(caches removed, bytes freed)``. Only directories named
    as ``cached()`` names them are touched; a symlink there is removed, never
    followed; the deletion walks by directory fds (``shutil.rmtree``), so a symlink
    planted inside cannot redirect it. Processes using a cache keep their open files.
    Raises :class:`~fastload.errors.UnsafePathError` for an untrusted directory."""
    base = _cached_dir(cache_dir)
    if not os.path.lexists(base):
        return 0, 0
    check_dir(base, shared=shared)
    removed = freed = 0
    for name in sorted(os.listdir(base)):
        if not _DIGEST_RE.match(name):
            continue
        path = base / name
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)  # a planted symlink or file: the link goes, its target stays
            continue
        check_dir(path, shared=shared)
        size = _tree_bytes(path)
        shutil.rmtree(path)
        removed += 1
        freed += size
    return removed, freed


#: ``cached(dataset, cache_dir=...)``: wrap the map-style ``dataset`` so each item is
#: made once and then read from the node-local cache in ``cache_dir``; it is
#: :class:`CachedDataset` itself, so the two never take different arguments.
cached = CachedDataset
