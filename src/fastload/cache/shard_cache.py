"""The cache facade the datasets use: :class:`ShardCache`.

``ShardCache(cache_dir=None | path, cache_limit=None, ram_limit="2GB")`` opens shards by
content address ``(dataset id, shard name, manifest checksum)``:

* with a ``cache_dir`` (node-local NVMe): :meth:`ShardCache.open_shard` returns a
  :class:`CachedShard` whose ``path`` is the verified local file (fetched once per node,
  however many processes ask) and whose ``data`` is a read-only memoryview of its mmap;
  the entry stays pinned (never evicted) until the shard is closed;
* without one: the shard's bytes are fetched, verified and kept in the byte-budgeted RAM
  tier of this process; ``path`` is None and ``data`` views those bytes.

``fetch`` is a callback that writes the shard's bytes into the file object it is given
(e.g. ``lambda f: store.download(name, f, expected_size=size)``); the cache never
imports :mod:`fastload.storage` itself. :meth:`ShardCache.prefetch` stages upcoming
shards in background threads; :meth:`ShardCache.read_small` caches index sidecars and
other small objects in RAM (on disk too, when there is a disk tier).

**A full cache degrades.** When pinned entries (of any process) and downloads in
progress leave no room under the cap for ``room_wait_s``, :meth:`ShardCache.open_shard`
reads the shard without caching it: fetched and verified into this process's RAM, the
cap untouched, counted (``uncached_reads``, also in ``fastload cache stats``) and warned
about once per process; for :data:`RECHECK_S` (30 s) after that, opens look for room once
without waiting. ``on_full="raise"`` raises :class:`CacheFullError` instead. A shard
whose download another process holds but no longer heartbeats (stopped, hung: see
:mod:`fastload.cache.locks`), or that cannot be reserved because a process stopped
inside a catalog write transaction holds the catalog, is read the same way after
``lease_s`` (``lease_bypasses``), whatever ``on_full``.
"""

from __future__ import annotations

import functools
import io
import mmap
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

from fastload.cache.catalog import CatalogBusy
from fastload.cache.disk import DiskTier, EntryKey, FetchFn, Pin, VerifyPolicy
from fastload.cache.locks import LeaseExpired
from fastload.cache.prefetch import Prefetcher
from fastload.cache.ram import RamTier
from fastload.config import CacheConfig, parse_size
from fastload.errors import CacheError, CacheFullError, ConfigError
from fastload.shards.checksum import check, xxh3_128

__all__ = ["CachedShard", "ShardCache", "ShardLike", "dataset_id"]

#: After an uncached read, how long further opens look for room once without waiting.
RECHECK_S = 30.0
# the pid that was warned about uncached reads (once per process)
_WARNED = {"pid": 0}
_WARN_LOCK = threading.Lock()


def dataset_id(url: str) -> str:
    """The dataset id used in cache keys: the dataset root URL without trailing slashes
    (every user of the cache must derive it the same way to share entries)."""
    return url.rstrip("/") or url


class ShardLike(Protocol):
    """What the cache needs of a shard (``fastload.shards.manifest.ShardInfo`` fits)."""

    @property
    def name(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def checksum(self) -> str: ...


class CachedShard:
    """An open cached shard: ``data`` (read-only memoryview, zero copy), ``path`` (the
    local file, or None when served from RAM) and ``key``. Close it (or use ``with``)
    to release the mapping and the pin."""

    def __init__(
        self,
        key: EntryKey,
        data: memoryview,
        path: Path | None,
        release: Callable[[], None] | None = None,
        mapping: mmap.mmap | None = None,
    ) -> None:
        self.key = key
        self.data = data
        self.path = path
        self._release = release
        self._mapping = mapping

    def __enter__(self) -> CachedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.data.nbytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._release is None and self._mapping is None

    def close(self) -> None:
        """Release the pin and the mapping; views still exported from ``data`` keep the
        mapping alive until they are released (the pin is released regardless)."""
        release, self._release = self._release, None
        mapping, self._mapping = self._mapping, None
        with suppress(BufferError):
            self.data.release()
        if mapping is not None:
            with suppress(BufferError):
                mapping.close()
        if release is not None:
            release()


class ShardCache:
    """Disk tier (if ``cache_dir``) + RAM tier + prefetcher behind one object.

    ``cache_limit`` caps the disk tier (bytes or ``"400GB"``; None: no cap), ``ram_limit``
    the RAM tier. ``verify`` is the disk tier's policy (``"publish"`` or ``"open"``);
    ``room_wait_s``, ``lease_s`` and ``shared`` are the disk tier's (see
    :class:`DiskTier`); ``on_full`` is what a full cache does (``"stream"``: read the
    shard uncached, see the module docstring; ``"raise"``: :class:`CacheFullError`).
    Prefetch keeps at most ``prefetch_bytes`` in flight with ``prefetch_workers`` threads.
    Raises :class:`ConfigError` on bad settings.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str = 2 * 10**9,
        wait_deadline_s: float = 600.0,
        verify: VerifyPolicy = "publish",
        prefetch_bytes: int | str = 4 * 10**9,
        prefetch_workers: int = 2,
        *,
        room_wait_s: float = 5.0,
        shared: bool = False,
        sync_publish: bool = False,
        on_full: str = "stream",
        lease_s: float = 10.0,
    ) -> None:
        if on_full not in ("stream", "raise"):
            raise ConfigError(f"ShardCache on_full must be 'stream' or 'raise', got {on_full!r}")
        self.on_full = on_full
        self._full_until = 0.0
        self.disk = (
            None
            if cache_dir is None
            else DiskTier(
                cache_dir,
                cache_limit,
                wait_deadline_s=wait_deadline_s,
                verify=verify,
                room_wait_s=room_wait_s,
                shared=shared,
                sync_publish=sync_publish,
                lease_s=lease_s,
            )
        )
        self.ram = RamTier(ram_limit, wait_deadline_s=wait_deadline_s)
        self._prefetch_bytes = parse_size(prefetch_bytes, "prefetch_bytes")
        self._prefetch_workers = prefetch_workers
        self._prefetcher: Prefetcher[EntryKey] | None = None
        self._prefetch_jobs: dict[EntryKey, tuple[str, ShardLike, Callable[[ShardLike], FetchFn]]]
        self._prefetch_jobs = {}  # scheduled, not started: pruned as they start or drop
        self._jobs_lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def from_config(cls, config: CacheConfig) -> ShardCache:
        """A cache with the settings of ``config``."""
        return cls(
            cache_dir=config.cache_dir,
            cache_limit=config.cache_limit,
            ram_limit=config.ram_limit,
            wait_deadline_s=config.wait_deadline_s,
            prefetch_bytes=config.prefetch_bytes,
            verify="open" if config.verify == "open" else "publish",
            prefetch_workers=config.prefetch_workers,
            room_wait_s=config.room_wait_s,
            shared=config.shared,
            sync_publish=config.sync_publish,
            on_full=config.on_full,
            lease_s=config.lease_s,
        )

    @staticmethod
    def key(dataset_id: str, shard: ShardLike) -> EntryKey:
        """The content address of ``shard`` of the dataset ``dataset_id`` (its URL)."""
        return EntryKey(dataset_id, shard.name, shard.checksum)

    # ------------------------------------------------------------------ shards
    def open_shard(self, dataset_id: str, shard: ShardLike, fetch: FetchFn) -> CachedShard:
        """Open ``shard`` (fetching it with ``fetch`` if it is not cached); see the module
        docstring. Raises :class:`CacheFullError` if it cannot fit, :class:`CacheError`
        if fetching or verifying fails."""
        key = self.key(dataset_id, shard)
        if self.disk is None:
            data = self.ram.get_or_load(key, lambda: _fetch_to_bytes(key, shard.bytes, fetch))
            return CachedShard(key, memoryview(data), None)
        disk = self.disk
        try:
            pin = disk.open_pinned(key, shard.bytes, fetch, room_wait_s=self._room_wait())
        except (CacheFullError, LeaseExpired, CatalogBusy) as exc:
            data = self._uncached(key, shard.bytes, fetch, exc)
            return CachedShard(key, memoryview(data), None)
        release = functools.partial(_release_pin, disk, pin)
        try:
            if shard.bytes == 0:
                return CachedShard(key, memoryview(b""), pin.path, release)
            mapping = mmap.mmap(pin.fd, 0, access=mmap.ACCESS_READ)
        except BaseException as exc:
            release()
            if isinstance(exc, OSError):
                raise CacheError(f"cannot map the cached {key} at {pin.path}: {exc}") from exc
            raise
        return CachedShard(key, memoryview(mapping), pin.path, release, mapping)

    def _room_wait(self) -> float | None:
        """The room wait of the next open: none right after an uncached read."""
        return 0.0 if time.monotonic() < self._full_until else None

    def _uncached(
        self,
        key: EntryKey,
        size: int,
        fetch: FetchFn,
        exc: CacheFullError | LeaseExpired | CatalogBusy,
    ) -> bytes:
        """Read ``key`` without caching it (see the module docstring), or re-raise
        ``exc`` where the user asked for :class:`CacheFullError`."""
        assert self.disk is not None
        bypassed = isinstance(exc, (LeaseExpired, CatalogBusy))
        if not bypassed:
            if self.on_full == "raise":
                raise exc
            self._full_until = time.monotonic() + RECHECK_S
        data = _fetch_to_bytes(key, size, fetch)
        self.disk.count_uncached(bypassed=bypassed)
        with _WARN_LOCK:
            first = _WARNED["pid"] != os.getpid()
            _WARNED["pid"] = os.getpid()
        if first:
            warnings.warn(
                f"fastload read {key} without caching it ({exc}); further uncached reads "
                "of this process are counted in loader.stats() and `fastload cache stats` "
                "(uncached_reads, lease_bypasses) without a warning",
                RuntimeWarning,
                stacklevel=3,
            )
        return data

    def ensure(self, dataset_id: str, shard: ShardLike, fetch: FetchFn) -> None:
        """Make sure ``shard`` is cached (on disk, or in RAM without a disk tier). With
        ``on_full="stream"`` a full cache (or a stalled download) leaves it uncached:
        its later :meth:`open_shard` reads it without caching."""
        key = self.key(dataset_id, shard)
        if self.disk is None:
            self.ram.get_or_load(key, lambda: _fetch_to_bytes(key, shard.bytes, fetch))
            return
        try:
            self.disk.get(key, shard.bytes, fetch)
        except (LeaseExpired, CatalogBusy):
            return
        except CacheFullError:
            if self.on_full == "raise":
                raise

    def prefetch(
        self,
        dataset_id: str,
        upcoming: Sequence[ShardLike],
        fetch_for: Callable[[ShardLike], FetchFn],
    ) -> None:
        """Stage ``upcoming`` shards (soonest first) in the background; replaces the
        previous schedule. Errors are not raised here: the later :meth:`open_shard` of
        the same shard raises them."""
        if self._pid != os.getpid():
            # a forked child must not use the parent's threads (they do not exist here)
            self._prefetcher, self._pid = None, os.getpid()
            self._jobs_lock, self._prefetch_jobs = threading.Lock(), {}
        jobs = {self.key(dataset_id, s): (dataset_id, s, fetch_for) for s in upcoming}
        if self.disk is not None:
            # what is cached already needs no thread (a warm epoch schedules every shard
            # of its plan; 16 threads, each with its own catalog connection, cost ~20%
            # of a warm 2,000-sample epoch here)
            cached = self.disk.ready_among(jobs)
            jobs = {k: job for k, job in jobs.items() if k not in cached}
        if self._prefetcher is None:
            if not jobs:
                return
            headroom = self.disk.evictable_headroom if self.disk else self.ram.headroom
            self._prefetcher = Prefetcher(
                self._prefetch_one, self._prefetch_bytes, headroom, self._prefetch_workers
            )
            # a cache dropped unclosed (its loader and dataset collected) ends its
            # prefetch threads; they hold it only by weak reference
            weakref.finalize(self, self._prefetcher.stop)
        with self._jobs_lock:
            self._prefetch_jobs.update(jobs)
        self._prefetcher.schedule([(k, job[1].bytes) for k, job in jobs.items()])
        # jobs the new schedule dropped, and not in flight, will never run: forget them
        busy = self._prefetcher.in_flight()
        with self._jobs_lock:
            for k in [k for k in self._prefetch_jobs if k not in jobs and k not in busy]:
                del self._prefetch_jobs[k]

    def _prefetch_one(self, key: EntryKey) -> None:
        with self._jobs_lock:
            job = self._prefetch_jobs.pop(key, None)
        if job is not None:
            dataset_id, shard, fetch_for = job
            self.ensure(dataset_id, shard, fetch_for(shard))

    @property
    def prefetcher(self) -> Prefetcher[EntryKey] | None:
        """The prefetcher, once :meth:`prefetch` started it."""
        return self._prefetcher

    # ------------------------------------------------------------ small objects
    def read_small(
        self, dataset_id: str, name: str, size: int, checksum: str, fetch: FetchFn
    ) -> bytes:
        """Return the verified bytes of a small object (an index sidecar), cached in RAM
        and, with a disk tier, on disk. Raises :class:`CacheError` on failure."""
        key = EntryKey(dataset_id, name, checksum)
        disk = self.disk
        if disk is None:
            return self.ram.get_or_load(key, lambda: _fetch_to_bytes(key, size, fetch))

        def load() -> bytes:
            try:
                pin = disk.open_pinned(key, size, fetch, room_wait_s=self._room_wait())
            except (CacheFullError, LeaseExpired, CatalogBusy) as exc:
                return self._uncached(key, size, fetch, exc)
            try:
                return os.pread(pin.fd, size, 0) if size else b""
            finally:
                _release_pin(disk, pin)

        return self.ram.get_or_load(key, load)

    # -------------------------------------------------------------------- misc
    def stats(self) -> dict[str, Any]:
        """Counters of every tier: ``{"disk": DiskTierStats | None, "ram": RamTierStats,
        "prefetch": PrefetchStats | None}``."""
        return {
            "disk": None if self.disk is None else self.disk.stats(),
            "ram": self.ram.stats(),
            "prefetch": None if self._prefetcher is None else self._prefetcher.stats(),
        }

    def close(self) -> None:
        """Stop the prefetcher and close the catalog connection of this thread."""
        if self._prefetcher is not None and self._pid == os.getpid():
            self._prefetcher.close()
        self._prefetcher = None
        if self.disk is not None:
            self.disk.close()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release_pin(disk: DiskTier, pin: Pin) -> None:
    """Unpin (the shared flock goes with the descriptor) and let the tier trim."""
    if not pin.released:
        pin.release()
        disk.trim_to_cap()


def _fetch_to_bytes(key: EntryKey, size: int, fetch: FetchFn) -> bytes:
    buf = io.BytesIO()
    fetch(buf)
    data = buf.getvalue()
    check(str(key), size, key.checksum, len(data), xxh3_128(data))
    return data
