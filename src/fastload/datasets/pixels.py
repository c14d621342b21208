"""The decoded-pixel tier of a dataset: decode each shard's images once per node.

:class:`PixelTier` serves decoded samples of a :class:`~fastload.datasets.source.ShardSource`
(``pixel_cache=`` of :class:`~fastload.ShardedDataset` and
:class:`~fastload.StreamingDataset`). A *pixel shard* holds :data:`CHUNK_SAMPLES`
consecutive samples of one source shard. For a sample it

1. reads it from its pixel shard when that is READY in the node cache (a memory
   mapping: no decode; the images come out as the decoder would have made them);
2. else, if no process on the node is building that pixel shard, builds it now: plans
   every image's size from its header, reserves the bytes under the cap *without
   evicting anything* (:func:`fastload.cache.derived.publish_built`), decodes its
   samples into the part file, publishes it and serves from it;
3. else, when another process is building it, builds one of the next pixel shards
   nobody has started (work the epoch needs anyway; ``candidates``: the rank's plan
   for a :class:`~fastload.StreamingDataset`, the following ones for a map-style
   dataset) and looks again;
4. else (still being built, the cap has no room, or there is no disk tier) decodes
   the sample afresh, exactly as it would without the tier.

So the tier never waits for another process's build and never pushes a shard the epoch
reads out of the cache; when the cap cannot hold pixels it warns once per process and
the loader keeps decoding. The pixel entry is keyed by the source shard's checksum, the
chunk's number and the decode settings (:meth:`fastload.decode.pixels.PixelDecode.fingerprint`).
"""

from __future__ import annotations

import mmap
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import Any, NamedTuple

import numpy as np

from fastload.cache import DiskTier, EntryKey, EntryState
from fastload.cache.derived import build_lock, derived_key, open_ready, publish_built
from fastload.datasets.source import ShardSource
from fastload.decode.crop_sample import CropDecoder
from fastload.decode.pixels import (
    BAD,
    PIXELS,
    RAW,
    RECORD,
    PixelCache,
    PixelDecode,
    PixelShardView,
    ShardPlan,
    write_pixel_shard,
)
from fastload.errors import CacheError, DecodeError

__all__ = ["PixelTier", "PixelTierStats", "tier_or_none"]

#: Pixel shards looked at for one to build while the one needed is being built elsewhere.
_LOOK_AHEAD = 4
#: Samples of a source shard per pixel shard: the unit one process builds at a time.
#: Small, so that the processes of a filling epoch share the work evenly to its end
#: (with whole source shards, one worker still decoding the last one left the other
#: waiting on torch's in-order batches); large enough to keep mappings few.
CHUNK_SAMPLES = 32
#: Most pixel shards one process keeps mapped.
_MAX_OPEN = 8192

Part = tuple[int, int]  # (source shard, chunk): one pixel shard
#: ``out=`` of :meth:`PixelTier.sample`: an image field's destination, or None
Slots = Callable[[str], "np.ndarray | None"]


class _Named(NamedTuple):
    name: str
    checksum: str


class PixelTierStats(dict[str, int]):
    """This process's counts: ``hits`` (samples read from pixel shards), ``built``
    (pixel shards this process wrote), ``decoded`` (samples decoded afresh),
    ``busy`` (of those, because another process was still building their shard
    after this one built another meanwhile),
    ``no_room`` (pixel shards not stored: the cap had no room)."""


class _Open:
    __slots__ = ("mapping", "pin", "view")

    def __init__(self, pin: Any, mapping: mmap.mmap | None, view: PixelShardView) -> None:
        self.pin, self.mapping, self.view = pin, mapping, view

    def close(self) -> None:
        self.view.buffer = None
        self.view.records = np.zeros(0, RECORD)
        if self.mapping is not None:
            with suppress(BufferError):  # an array still views it: the GC unmaps it later
                self.mapping.close()
        self.pin.release()


class PixelTier:
    """Decoded samples of ``source`` through the node's pixel shards (see the module
    docstring). ``decoder`` is the dataset's :class:`~fastload.decode.Decoder`;
    ``options`` the :class:`~fastload.PixelCache`. Picklable: the process-local state
    (open mappings, counters, the warned flag) starts afresh in each process."""

    def __init__(self, source: ShardSource, decoder: Any, options: PixelCache) -> None:
        self.source = source
        #: the dataset's CropDecoder when its crops are cut from the stored pixels (the
        #: tier then stores each image whole, :meth:`CropDecoder.stored`); None otherwise
        self.crop: CropDecoder | None = decoder if isinstance(decoder, CropDecoder) else None
        self.decode = PixelDecode(decoder if self.crop is None else self.crop.stored(), options)
        self._fingerprint = self.decode.fingerprint()
        self._settings = self.decode.settings()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._open: OrderedDict[Part, _Open] = OrderedDict()
        self._skip: set[Part] = set()  # pixel shards not stored here (no room): decode them
        #: shards this process will read, soonest first (None: every shard); while a
        #: shard it needs is being built elsewhere, it builds one of these meanwhile
        self.candidates: list[int] | None = None
        self._warned = False
        counts = self.source.shard_samples
        self._most_chunks = max(1, -(-max(counts, default=1) // CHUNK_SAMPLES))
        self.stats = PixelTierStats(hits=0, built=0, decoded=0, busy=0, no_room=0)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("source", "crop", "decode", "_fingerprint", "_settings")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def key(self, part: Part) -> EntryKey:
        """The cache key of pixel shard ``part``: samples ``chunk * CHUNK_SAMPLES``
        onwards of source shard ``shard``, for ``part = (shard, chunk)``."""
        info = self.source.manifest.shards[part[0]]
        named = _Named(f"{info.name}.{part[1]}", info.checksum)
        return derived_key(self.source.dataset_id, named, "px", self._fingerprint)

    def _chunks(self, shard: int) -> int:
        return -(-int(self.source.shard_samples[shard]) // CHUNK_SAMPLES)

    # ---------------------------------------------------------------- reading
    def sample(self, shard: int, j: int, out: Slots | None = None) -> dict[str, Any]:
        """Sample ``j`` of shard ``shard``, decoded (before the dataset's transform).
        ``out(field)``: a writable ``(H, W, C)`` uint8 array for that image field's
        pixels, or None; a stored image of that shape is copied straight from the
        mapped pixel shard into it and the sample holds it (as the decoder's output),
        with no array of its own (a slot of a batch: :mod:`fastload.loader.pixel_batches`);
        an image decoded afresh is not written there. Raises :class:`DecodeError`
        naming the shard and the sample's key for an image that does not decode."""
        if self._pid != os.getpid():
            self._reset()
        opened = self._pixels((shard, j // CHUNK_SAMPLES))
        if opened is None:
            return self._fresh(shard, j)
        key, recs = opened.view.sample(j % CHUNK_SAMPLES)
        self.stats["hits"] += 1
        names = opened.view.names
        pairs: list[tuple[str, Any]] = []
        images: dict[str, Any] = {}
        for rec in recs:
            name = names[int(rec["field"])]
            kind = int(rec["kind"])
            if kind == RAW:
                pairs.append((name, opened.view.field(rec)))
                continue
            pairs.append((name, None))
            if kind == PIXELS:
                orig = (int(rec["orig_width"]), int(rec["orig_height"]))
                slot = None if out is None or self.crop is not None else out(name)
                # a crop is cut from a view of the mapping (a new array), not a copy
                pixels = opened.view.field(rec, copy=self.crop is None and slot is None)
                if slot is not None and slot.shape == pixels.shape:
                    np.copyto(slot, pixels)
                    pixels = slot
                elif slot is not None:
                    pixels = pixels.copy()
                images[name] = (pixels, orig)
            else:  # BAD: decode it afresh, which raises what a fresh decode raises
                raw = self.source.read_local(shard, j)
                images[name] = self._decode_one(shard, key, name, raw[name])
        return self._assemble(key, pairs, images)

    def missing(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The entries of ``indices`` (the source's sample indices, manifest order)
        whose pixel shard is not READY in the node cache now, as an int64 array: empty
        when every one of them would be read from the tier with no decode (all of them
        without a disk tier). One catalog read for the pixel shards not open here."""
        if self._pid != os.getpid():
            self._reset()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        disk = self.source.cache.disk
        if disk is None or not idx.size:
            return idx
        starts = np.asarray(self.source.manifest.sample_starts, dtype=np.int64)
        shards = np.searchsorted(starts, idx, side="right") - 1
        codes = shards * self._most_chunks + (idx - starts[shards]) // CHUNK_SAMPLES
        wanted = np.unique(codes).tolist()
        absent: list[int] = []
        with self._lock:
            unknown = [c for c in wanted if divmod(c, self._most_chunks) not in self._open]
        with disk.catalog.read() as conn:
            for code in unknown:
                part = divmod(code, self._most_chunks)
                row = None if part in self._skip else disk.catalog.row(conn, self.key(part).name)
                if row is None or row.state is not EntryState.READY:
                    absent.append(code)
        if not absent:
            return idx[:0]
        return idx[np.isin(codes, np.asarray(absent, dtype=np.int64))]

    def counts(self) -> dict[str, int]:
        """This process's :class:`PixelTierStats` as ``pixel_<name>`` counters (what a
        dataset's ``io_stats()`` adds); a forked child starts from zero."""
        if self._pid != os.getpid():
            self._reset()
        return {f"pixel_{k}": int(v) for k, v in self.stats.items()}

    def _assemble(self, key: str, pairs: list[tuple[str, Any]], images: dict[str, Any]) -> Any:
        if self.crop is None:
            return self.decode.assemble(key, pairs, images)
        # this epoch's crop, cut from the whole image's pixels
        return self.crop.from_pixels(key, pairs, images)

    def _fresh(self, shard: int, j: int) -> dict[str, Any]:
        self.stats["decoded"] += 1
        sample = self.source.read_local(shard, j)
        try:
            if self.crop is None:
                return self.decode.decode(sample)
            key = str(sample.get("__key__", "?"))
            pairs = [(n, v) for n, v in sample.items() if not n.startswith("__")]
            images = {
                n: self.decode.pixels(v, f"{key}.{n}") for n, v in pairs if self.decode.is_image(n)
            }
            return self._assemble(key, pairs, images)
        except DecodeError as exc:
            raise DecodeError(self._where(shard, exc)) from exc

    def _decode_one(self, shard: int, key: str, name: str, data: Any) -> Any:
        try:
            return self.decode.pixels(data, f"{key}.{name}")
        except DecodeError as exc:
            raise DecodeError(self._where(shard, exc)) from exc

    def _where(self, shard: int, exc: Exception) -> str:
        info = self.source.manifest.shards[shard]
        return f"in shard {info.name!r} of {self.source.url}: {exc}"

    def _disk(self) -> DiskTier | None:
        disk = self.source.cache.disk
        if disk is None and not self._warned:
            self._warned = True
            warnings.warn(
                f"pixel_cache: {self.source.url} has no disk tier (cache_dir): images are "
                "decoded every time",
                stacklevel=4,
            )
        return disk

    def _pixels(self, part: Part) -> _Open | None:
        with self._lock:
            got = self._open.get(part)
            if got is not None:
                self._open.move_to_end(part)
                return got
        if part in self._skip:
            return None
        disk = self._disk()
        if disk is None:
            return None
        key = self.key(part)
        pin = open_ready(disk, key)
        if pin is None:
            pin, busy = self._try_build(disk, key, part)
            if busy:
                # another process is building it: build another one meanwhile (work
                # the epoch needs anyway), then look again; decode afresh only if it
                # is still being built
                self._build_other(disk, part)
                pin = open_ready(disk, key)
                if pin is None:
                    self.stats["busy"] += 1
                    return None
            if pin is None:
                return None
        return self._keep(part, key, pin)

    def _try_build(self, disk: DiskTier, key: EntryKey, part: Part) -> tuple[Any, bool]:
        """Build pixel shard ``part`` if nobody is: ``(pin or None, busy)``."""
        with build_lock(disk, key) as mine:
            if not mine:
                return None, True
            pin = open_ready(disk, key)  # built while we took the lock
            if pin is None:
                pin = self._build(disk, key, part)
            return pin, False

    def _following(self, busy: Part) -> Iterator[Part]:
        """Pixel shards after ``busy``: the rest of its source shard, then those of the
        :attr:`candidates` (or of the following source shards)."""
        shard, chunk = busy
        yield from ((shard, c) for c in range(chunk + 1, self._chunks(shard)))
        order = self.candidates
        n = len(self.source.manifest.shards)
        for s in order if order is not None else ((shard + k) % n for k in range(1, n)):
            if s != shard:
                yield from ((s, c) for c in range(self._chunks(s)))

    def _build_other(self, disk: DiskTier, busy: Part) -> None:
        """Build one pixel shard among the next few after ``busy`` that nobody has
        built or is building (at most :data:`_LOOK_AHEAD` looked at)."""
        looked = 0
        for s in self._following(busy):
            if looked >= _LOOK_AHEAD:
                return
            if s in self._skip or s in self._open:
                continue
            looked += 1
            key = self.key(s)
            with disk.catalog.read() as conn:
                row = disk.catalog.row(conn, key.name)
            if row is not None:
                continue  # READY, or being built
            pin, other_busy = self._try_build(disk, key, s)
            if pin is not None:
                self._keep(s, key, pin)
                return
            if not other_busy:
                return  # no room: the warning is given, building more would not fit

    def _keep(self, part: Part, key: EntryKey, pin: Any) -> _Open:
        try:
            mapping = mmap.mmap(pin.fd, 0, access=mmap.ACCESS_READ)
            view = PixelShardView(mapping, str(key))
        except BaseException as exc:
            pin.release()
            if isinstance(exc, OSError):
                raise CacheError(f"cannot map the pixel shard {key} at {pin.path}: {exc}") from exc
            raise
        opened = _Open(pin, mapping, view)
        with self._lock:
            old = self._open.pop(part, None)
            self._open[part] = opened
            # as many source shards' worth of pixel shards as the source keeps open
            bound = max(1, self.source.max_open_shards) * self._most_chunks
            while len(self._open) > min(_MAX_OPEN, bound):
                _, gone = self._open.popitem(last=False)
                gone.close()
        if old is not None:
            old.close()
        return opened

    # --------------------------------------------------------------- building
    def _plan(self, idx: Any, data: Any, samples: range) -> ShardPlan:
        # an exact size is known without reading each image's header: the original
        # size is filled in as each image is decoded (the table is written last)
        fixed = self.decode.fixed_shape if self.crop is None else None
        keys: list[str] = []
        names: list[str] = []
        where: dict[str, int] = {}
        rows: list[tuple[Any, ...]] = []
        offset = 0
        for j in samples:
            entry = idx.sample(j)
            key = str(entry.pop("__key__"))
            keys.append(key)
            j -= samples.start
            for name, (o, n) in entry.items():
                f = where.setdefault(name, len(names))
                if f == len(names):
                    names.append(name)
                if self.decode.is_image(name) and fixed is not None:
                    h, w, c = fixed
                    rows.append((j, f, PIXELS, c, offset, h * w * c, h, w, 0, 0))
                    offset += h * w * c
                elif self.decode.is_image(name):
                    try:
                        p = self.decode.plan(data[o : o + n], f"{key}.{name}")
                    except DecodeError:
                        rows.append((j, f, BAD, 0, offset, 0, 0, 0, 0, 0))
                        continue
                    rows.append(
                        (j, f, PIXELS, p.channels, offset, p.nbytes, p.height, p.width, *p.original)
                    )
                    offset += p.nbytes
                else:
                    rows.append((j, f, RAW, 0, offset, n, 0, 0, 0, 0))
                    offset += n
        return ShardPlan(keys, names, np.array(rows, dtype=RECORD))

    def _build(self, disk: DiskTier, key: EntryKey, part: Part) -> Any:
        shard, chunk = part
        idx = self.source.index(shard)
        data = self.source.shard(shard).data
        samples = range(chunk * CHUNK_SAMPLES, min((chunk + 1) * CHUNK_SAMPLES, idx.num_samples))
        plan = self._plan(idx, data, samples)
        size = plan.file_bytes(self._settings)
        spans: list[tuple[int, int]] = []
        for j in samples:
            entry = idx.sample(j)
            entry.pop("__key__")
            spans.extend(entry.values())

        fixed = self.decode.fixed_shape if self.crop is None else None
        # one buffer the images of an exact size are decoded into, written out in turn
        scratch = None if fixed is None else np.empty(fixed, dtype=np.uint8)

        def content(r: int) -> Any:
            rec = plan.records[r]
            o, n = spans[r]
            if int(rec["kind"]) == RAW:
                return data[o : o + n]
            if int(rec["kind"]) == BAD:
                return None
            label = f"{plan.keys[int(rec['sample'])]}.{plan.names[int(rec['field'])]}"
            try:
                arr, orig = self.decode.pixels(data[o : o + n], label, out=scratch)
            except DecodeError:
                return None  # stored as BAD: a read decodes it afresh and raises
            if arr.shape != (int(rec["height"]), int(rec["width"]), int(rec["channels"])):
                return None
            rec["orig_width"], rec["orig_height"] = orig
            return arr

        pin = publish_built(
            disk, key, size, lambda f: write_pixel_shard(f, plan, self._settings, content)
        )
        if pin is None:
            self._skip.add(part)
            self.stats["no_room"] += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"pixel_cache: no room under the cache limit of {disk.root} for the "
                    f"pixel shard of {self.source.manifest.shards[shard].name!r} ({size} "
                    "bytes) without evicting shards: its images (and any others that do "
                    "not fit) are decoded every epoch; raise cache_limit to keep them",
                    stacklevel=5,
                )
            return None
        self.stats["built"] += 1
        return pin

    def close(self) -> None:
        """Unmap and unpin this process's open pixel shards."""
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            while self._open:
                _, opened = self._open.popitem()
                opened.close()


def tier_or_none(source: ShardSource, decoder: Any, pixel_cache: Any) -> PixelTier | None:
    """The dataset's :class:`PixelTier` for its ``pixel_cache=`` (None when off).
    Raises :class:`~fastload.errors.ConfigError` for an option or decoder the tier
    cannot serve."""
    from fastload.decode.pixels import pixel_cache_option

    options = pixel_cache_option(pixel_cache)
    if options is None:
        return None
    return PixelTier(source, decoder, options)
