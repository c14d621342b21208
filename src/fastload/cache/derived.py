"""Derived entries of the NVMe tier: files made on the node from a cached shard (the
decoded-pixel tier, :mod:`fastload.datasets.pixels`), published beside the shards.

A derived entry is keyed like a shard (:class:`~fastload.cache.EntryKey`): the dataset,
the *source* shard's manifest checksum, and a name that is the source shard's name plus
``.<kind>-<settings fingerprint>``; so a changed source object or other settings give
another entry, never a stale one. Its content is made here rather than fetched, so its
own xxh3-128 is not known in advance: it is computed as the builder writes the part
file, the file's size checked against the reservation, and the catalog row records
that content checksum (``fastload cache verify`` and ``verify="open"`` re-hash against
it, as for shards).

The same machinery as shards, with two differences:

- **single flight without waiting**: :func:`build_lock` takes the entry's lock only if
  it is free. A reader that finds another process building falls back to its own work
  (decoding the one sample it needs) instead of waiting for the whole file;
- **room without eviction**: :func:`publish_built` reserves the bytes only if they fit
  under the cap as it is, evicting nothing (a derived entry is an acceleration: it must
  never push out the shards an epoch reads, or an epoch would thrash the cache). When
  they do not fit it returns None and counts ``<kind>_no_room``.

Everything else is the tier's: a FETCHING reservation counted under the cap, and the
tier's one publish sequence (``TierPublishing._publish_part``, the same code as a raw
shard's, with a verify callback that takes the checksum from the write rather than
checking the manifest's): a part file in ``tmp/`` (``O_EXCL``, 0600), pinned before it
is visible, ``os.replace`` into ``data/``, READY last; a
builder killed mid-write leaves a FETCHING row and a part file that the next build of
the entry (or the tier's sweep and room-making) removes: nothing is ever served that
was not whole and hashed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from fastload.cache._entries import EntryKey, FetchFn, Pin
from fastload.cache._room import GROWTH
from fastload.cache.catalog import BLOCK, EntryState, blocks
from fastload.cache.disk import DiskTier
from fastload.errors import CacheError, FastloadError
from fastload.shards.checksum import Xxh3Hasher

__all__ = [
    "DERIVED_KINDS",
    "build_lock",
    "derived_key",
    "derived_kind",
    "open_ready",
    "publish_built",
]

#: The kinds of derived entry fastload writes (the mark in their names).
DERIVED_KINDS: tuple[str, ...] = ("px",)


class _ShardLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def checksum(self) -> str: ...


def derived_key(dataset_id: str, shard: _ShardLike, kind: str, fingerprint: str) -> EntryKey:
    """The key of the ``kind`` entry derived from ``shard`` with settings whose
    fingerprint is ``fingerprint`` (lower-case hex)."""
    if kind not in DERIVED_KINDS:
        raise CacheError(f"unknown derived entry kind {kind!r}")
    return EntryKey(dataset_id, f"{shard.name}.{kind}-{fingerprint}", shard.checksum)


def derived_kind(shard_name: str) -> str | None:
    """The derived kind of an entry by its shard name (None for a plain shard)."""
    stem, dot, tail = shard_name.rpartition(".")
    if not dot or not stem:
        return None
    kind, dash, fp = tail.partition("-")
    if kind in DERIVED_KINDS and dash and fp and all(c in "0123456789abcdef" for c in fp):
        return kind
    return None


def open_ready(disk: DiskTier, key: EntryKey) -> Pin | None:
    """Pin the READY entry ``key`` (counted as a hit) or return None when it is absent,
    being built, or being evicted."""
    with disk.catalog.read() as conn:
        row = disk.catalog.row(conn, key.name)
    if row is None or row.state is not EntryState.READY:
        return None
    return disk._hit(key, row.size, disk.path_for(key))


@contextmanager
def build_lock(disk: DiskTier, key: EntryKey) -> Iterator[bool]:
    """Hold ``key``'s entry lock if nobody does (yields True), else yield False at once."""
    with disk.locks.try_hold(key.flat) as free:
        yield free


def publish_built(disk: DiskTier, key: EntryKey, size: int, write: FetchFn) -> Pin | None:
    """Under :func:`build_lock`: reserve ``size`` bytes for ``key`` without evicting
    anything, let ``write(f)`` write the content (it returns the :class:`Xxh3Hasher` it
    fed every byte), check it, and publish it READY. Returns the pinned entry, or None
    when the bytes do not fit under the cap now. Raises :class:`CacheError` when writing
    or publishing fails (the entry is left absent); a cancelled build is re-raised."""
    kind = derived_kind(key.shard) or "derived"
    path = disk.path_for(key)
    disk._remove_temp_files(key.flat)  # of a builder killed mid-write: we hold its lock
    with disk._txn() as conn:
        cap = disk.catalog.cap(conn)
        disk._limit = cap
        if cap is not None:
            dir_cost = 0 if os.path.lexists(path.parent) else BLOCK
            need = blocks(size) + dir_cost + GROWTH
            if disk.catalog.used(conn) + disk.metadata_bytes() + need > cap:
                disk.catalog.bump(conn, **{f"{kind}_no_room": 1})
                return None
        disk.catalog.put(
            conn, key.name, key.dataset, key.shard, key.checksum, size, EntryState.FETCHING
        )

    def verify(fd: int, digest: object, part: Path) -> str:
        # made here, so nothing to check against: the checksum is the write's
        got = os.fstat(fd).st_size
        if not isinstance(digest, Xxh3Hasher) or digest.nbytes != size or got != size:
            raise CacheError(
                f"building {key} wrote {got} bytes into {part}, {size} were reserved: not published"
            )
        return digest.hexdigest_tagged()

    bumps = {f"{kind}_built": 1, f"{kind}_bytes_built": size}
    try:
        return disk._publish_part(key, size, write, path, verify, **bumps)
    except BaseException as exc:
        with suppress(FastloadError), disk._txn() as conn:
            disk.catalog.delete(conn, key.name, EntryState.FETCHING)
        if isinstance(exc, Exception) and not isinstance(exc, FastloadError):
            raise CacheError(
                f"building {key} into {disk.root} failed: {type(exc).__name__}: {exc}"
            ) from exc
        raise
