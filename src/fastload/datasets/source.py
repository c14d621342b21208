"""One dataset's shards through the tiers, as each process sees them.

:class:`ShardSource` ties the layers together for the datasets: the manifest (read
once, then carried to DataLoader workers with the dataset), the object store, the
:class:`~fastload.cache.ShardCache` (NVMe tier when a ``cache_dir`` is given, RAM
tier otherwise), the index sidecars (fetched on first touch of their shard, never
at start-up) and a few open, memory-mapped shards. Everything that holds a socket,
a thread, a sqlite handle or a mapping is made lazily per process, so a source
pickled into a spawned worker, or inherited by a forked one, starts clean.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, NamedTuple

from fastload._args import keyword_only
from fastload.cache import ShardCache
from fastload.cache.shard_cache import CachedShard, dataset_id
from fastload.config import CacheConfig, FetchConfig, env
from fastload.shards.checksum import Xxh3Hasher
from fastload.shards.index import ShardIndex
from fastload.shards.manifest import Manifest, ShardInfo, check_index
from fastload.storage import ObjectStore, open_store

__all__ = ["BuiltItems", "SampleRef", "ShardSource", "SourceBacked", "default_open_shards"]

#: Most shards one process keeps mapped when nothing bounds it (each is one mapping
#: and one pin; Linux allows ~65,000 mappings per process).
MAX_OPEN_SHARDS = 4096


class SampleRef(NamedTuple):
    """Where one sample's fields lie in its shard: ``spans`` is ``(field, offset,
    size)`` per field, in archive order. Small and picklable."""

    key: str
    shard: int
    spans: tuple[tuple[str, int, int], ...]


def default_open_shards(manifest: Manifest, cap: int | None) -> int:
    """How many shards a process keeps open by default: every shard when nothing
    caps the tier (a shuffled map-style epoch then re-opens no shard), else at most a
    quarter of what fits under ``cap`` (several processes pin their own open shards),
    and never fewer than 2 or more than :data:`MAX_OPEN_SHARDS`."""
    n = max(1, len(manifest.shards))
    if cap is not None:
        largest = max((s.bytes for s in manifest.shards), default=1) or 1
        n = min(n, max(2, cap // largest // 4))
    return max(1, min(n, MAX_OPEN_SHARDS))


class ShardSource:
    """Read samples of the dataset at ``url`` through the cache tiers.

    ``cache_dir``/``cache_limit`` configure the node-local disk tier (None:
    ``cache_config.cache_dir``, else ``$FASTLOAD_CACHE_DIR`` if set, else shards are
    held in this process's RAM tier of ``ram_limit`` bytes, 2 GB by default; ``~`` is
    expanded); ``cache_config`` gives the other cache knobs (wait deadline, verify
    policy, prefetch budget) and may give these three too: they combine by
    :meth:`CacheConfig.with_arguments` (a value set in both places must agree, or
    :class:`~fastload.errors.ConfigError`); ``max_open_shards``
    bounds the shards kept mapped (and pinned) at once (None: sized from the cap, see
    :func:`default_open_shards`). ``manifest`` may be passed when already read. All
    but ``url`` are keyword-only.
    Raises what :meth:`Manifest.load` raises for an unreadable dataset.
    """

    @keyword_only(
        "storage_options",
        "cache_dir",
        "cache_limit",
        "ram_limit",
        "fetch",
        "max_open_shards",
        "manifest",
        "cache_config",
    )
    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        fetch: FetchConfig | None = None,
        max_open_shards: int | None = None,
        manifest: Manifest | None = None,
        cache_config: CacheConfig | None = None,
    ) -> None:
        self.url = str(url).rstrip("/")
        self.storage_options = dict(storage_options or {})
        config = (cache_config or CacheConfig()).with_arguments(
            cache_dir=cache_dir, cache_limit=cache_limit, ram_limit=ram_limit
        )
        if config.cache_dir is None and env("FASTLOAD_CACHE_DIR"):
            config = config.with_arguments(cache_dir=env("FASTLOAD_CACHE_DIR"))
        self.cache_config = config
        self.cache_dir = config.cache_dir
        self.cache_limit = config.cache_limit
        self.ram_limit = config.ram_limit
        self.fetch = fetch
        self.dataset_id = dataset_id(self.url)
        if manifest is None:
            manifest = Manifest.from_json(self._new_store().read("manifest.json"), self.url)
        self.manifest = manifest
        self._open_setting = max_open_shards
        self.max_open_shards = self._size_open_shards()
        self.shard_samples = [s.samples for s in manifest.shards]
        self._starts = manifest.sample_starts
        self._reset()
        self._check_manifest()

    def _check_manifest(self) -> None:
        """Refuse a manifest this source cannot serve, and read what a subclass needs
        of it (called at the end of ``__init__``; a plain source serves any)."""

    # ------------------------------------------------------- process-local state
    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._store: ObjectStore | None = None
        self._cache: ShardCache | None = None
        self._indexes: dict[int, ShardIndex] = {}
        self._open: OrderedDict[int, CachedShard] = OrderedDict()
        self._served = {"disk": 0, "ram": 0}
        self.shard_opens = 0  # shards opened (mapped and pinned) by this process

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            # A forked child: the parent's sockets, threads, sqlite handle and pins are
            # not ours; drop them without closing (closing would act for the parent).
            self._reset()

    def _size_open_shards(self) -> int:
        if self._open_setting is not None:
            return max(1, int(self._open_setting))
        cap = self.cache_config.cache_limit if self.cache_dir else self.cache_config.ram_limit
        return default_open_shards(self.manifest, None if cap is None else int(cap))

    def use_cache_dir(self, cache_dir: str, cache_limit: int | str | None) -> None:
        """Serve this dataset from the disk tier at ``cache_dir`` from now on (the
        loader does this to share one RAM-backed tier between its worker processes).
        Closes what this process has open."""
        self.close()
        self.cache_dir = os.fspath(cache_dir)
        self.cache_limit = cache_limit
        self.cache_config = dataclasses.replace(
            self.cache_config, cache_dir=self.cache_dir, cache_limit=cache_limit
        )
        self.max_open_shards = self._size_open_shards()
        self._reset()

    def _new_store(self) -> ObjectStore:
        return open_store(self.url, self.storage_options or None, self.fetch)

    @property
    def store(self) -> ObjectStore:
        """This process's object store for the dataset root."""
        self._check_pid()
        if self._store is None:
            with self._lock:  # the prefetch threads ask too: one store, one set of counters
                if self._store is None:
                    self._store = self._new_store()
        return self._store

    @property
    def cache(self) -> ShardCache:
        """This process's view of the cache tiers."""
        self._check_pid()
        if self._cache is None:
            with self._lock:
                if self._cache is None:
                    self._cache = ShardCache.from_config(self.cache_config)
        return self._cache

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "url", "storage_options", "cache_dir", "cache_limit", "ram_limit", "fetch",
            "max_open_shards", "_open_setting", "dataset_id", "manifest", "shard_samples",
            "_starts", "cache_config",
        )  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """Global sample index → (shard number, index within the shard)."""
        return self.manifest.locate(i)

    def _fetcher(self, name: str, size: int) -> Any:
        from fastload.shards.gzipped import fetch_shard

        def fetch(f: BinaryIO) -> Xxh3Hasher:
            # the store is made only when something is fetched: a worker whose shards
            # and indexes the loader's process already staged never opens a connection
            digest = Xxh3Hasher()  # of the bytes as they are written (see DiskTier)
            fetch_shard(self.store, name, f, size, digest=digest)  # gunzipped if .gz
            return digest

        return fetch

    def index(self, shard: int) -> ShardIndex:
        """The index of shard ``shard`` (its sidecar, fetched and verified once)."""
        self._check_pid()
        idx = self._indexes.get(shard)
        if idx is None:
            info = self.manifest.shards[shard]
            data = self.cache.read_small(
                self.dataset_id,
                info.index_name,
                info.index_bytes,
                info.index_checksum,
                self._fetcher(info.index_name, info.index_bytes),
            )
            idx = ShardIndex.from_bytes(data, name=f"{self.url}/{info.index_name}")
            check_index(info, idx.shard_size, idx.num_samples, f"{self.url}/{info.index_name}")
            with self._lock:
                self._indexes[shard] = idx
        return idx

    def shard(self, shard: int) -> CachedShard:
        """The open (mapped, pinned) shard ``shard``; at most ``max_open_shards`` stay
        open, least recently used closed first."""
        self._check_pid()
        with self._lock:
            cached = self._open.get(shard)
            if cached is not None:
                self._open.move_to_end(shard)
                return cached
        info = self.manifest.shards[shard]
        with self._lock:
            # make room first: under a tight cap the pin of the shard closed here is
            # what lets the new one in
            while len(self._open) >= self.max_open_shards:
                _, old = self._open.popitem(last=False)
                old.close()
        cached = self.cache.open_shard(self.dataset_id, info, self._fetcher(info.name, info.bytes))
        with self._lock:
            self.shard_opens += 1
            other = self._open.pop(shard, None)  # another thread opened it meanwhile
            self._open[shard] = cached
            while len(self._open) > self.max_open_shards:
                _, old = self._open.popitem(last=False)
                old.close()
        if other is not None:
            other.close()
        return cached

    def read_local(self, shard: int, j: int) -> dict[str, Any]:
        """Sample ``j`` of shard ``shard`` as ``{"__key__": str, field: bytes}``."""
        idx = self.index(shard)
        entry = idx.sample(j)
        cached = self.shard(shard)
        data = cached.data
        out: dict[str, Any] = {"__key__": entry["__key__"]}
        total = 0
        for field, span in entry.items():
            if field != "__key__":
                offset, size = span
                out[field] = bytes(data[offset : offset + size])
                total += size
        self._served["ram" if cached.path is None else "disk"] += total
        return out

    def ref_local(self, shard: int, j: int) -> SampleRef:
        """Where sample ``j`` of shard ``shard`` lies, after making sure the shard is in
        a node-local tier (fetched if needed, kept open and pinned in this process's
        LRU of open shards). The loader's process reads the bytes from its own mapping
        of the same cache entry: nothing but this small record crosses processes."""
        idx = self.index(shard)
        entry = idx.sample(j)
        self.shard(shard)
        key = entry.pop("__key__")
        return SampleRef(key, shard, tuple((f, o, n) for f, (o, n) in entry.items()))

    def ref(self, i: int) -> SampleRef:
        """:meth:`ref_local` of global sample ``i``."""
        shard, j = self.locate(i)
        return self.ref_local(shard, j)

    def count_served(self, tier: str, nbytes: int) -> None:
        """Count bytes served from ``tier`` (``"disk"``/``"ram"``) by this process."""
        self._served[tier] += nbytes

    def read(self, i: int) -> dict[str, Any]:
        """Global sample ``i`` as ``{"__key__": str, field: bytes}``."""
        shard, j = self.locate(i)
        return self.read_local(shard, j)

    def prefetch(self, shards: Sequence[int]) -> None:
        """Stage these shards (soonest first) in the background."""
        infos: list[ShardInfo] = [self.manifest.shards[s] for s in shards]
        self.cache.prefetch(self.dataset_id, infos, lambda s: self._fetcher(s.name, s.bytes))

    def io_stats(self) -> dict[str, int]:
        """Cumulative counters of this process: bytes per tier, cache hits and misses."""
        self._check_pid()
        remote = self._store.stats().bytes_read if self._store is not None else 0
        hits = misses = uncached = bypasses = 0
        if self._cache is not None:
            # per-process counters only: this runs once per sample in loader workers
            disk = self._cache.disk
            st: Any = disk.counters() if disk is not None else self._cache.ram.stats()
            hits, misses = st.hits, st.misses
            uncached, bypasses = getattr(st, "uncached_reads", 0), getattr(st, "lease_bypasses", 0)
        return {
            "remote_bytes": int(remote),
            "disk_bytes": self._served["disk"],
            "ram_bytes": self._served["ram"],
            "cache_hits": int(hits),
            "cache_misses": int(misses),
            "uncached_reads": int(uncached),
            "lease_bypasses": int(bypasses),
        }

    def close(self) -> None:
        """Close open shards and the cache's threads and handles of this process."""
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


class SourceBacked:
    """What every dataset over a :class:`ShardSource` offers: its manifest, its I/O
    counters (:class:`fastload.loader.stats.IOStatsSource`) and ``close()``."""

    source: ShardSource

    @property
    def url(self) -> str:
        """The dataset root URL."""
        return self.source.url

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest."""
        return self.source.manifest

    def io_stats(self) -> dict[str, int]:
        """Bytes served per tier and cache hits/misses of this process; with the
        decoded-pixel tier also its ``pixel_hits``, ``pixel_built`` and
        ``pixel_decoded`` (:meth:`fastload.datasets.pixels.PixelTier.counts`)."""
        stats = self.source.io_stats()
        pixels = getattr(self, "pixels", None)
        if pixels is not None:
            stats.update(pixels.counts())
        return stats

    def close(self) -> None:
        """Release open shards and background threads of this process."""
        self.source.close()


class BuiltItems(SourceBacked):
    """A dataset whose item ``i`` is :meth:`build_item` of raw sample ``i`` (or, with
    the decoded-pixel tier, of sample ``i`` with its image already decoded): the
    torchvision drop-ins. It follows :class:`fastload.loader.BatchTransportDataset`."""

    #: the decoded-pixel tier (``pixel_cache=``, a
    #: :class:`fastload.datasets.pixels.PixelTier`), None when off
    pixels: Any = None

    def build_item(self, sample: Mapping[str, Any]) -> Any:
        """``ds[i]`` made from ``sample = ds.source.read(i)``."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        if self.pixels is not None:
            return self.build_item(self.pixels.sample(*self.source.locate(int(index))))
        return self.build_item(self.source.read(int(index)))

    @property
    def batch_transport(self) -> bool:
        """Whether :class:`fastload.DataLoader` may read raw samples from
        :attr:`source` and make items with :meth:`build_item` where the batch is built:
        true unless a subclass changes ``__getitem__`` or the pixel tier serves the
        images (each worker then reads its samples' pixels itself)."""
        return self.pixels is None and type(self).__getitem__ is BuiltItems.__getitem__

    def close(self) -> None:
        """Release open shards, pixel shards and background threads of this process."""
        if self.pixels is not None:
            self.pixels.close()
        super().close()
