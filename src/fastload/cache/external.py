"""The writers' side of external entries (see :mod:`fastload.cache._external`): files
fastload writes under ``cache_dir`` outside the shard tier, under the same cap.

- :func:`hold_tree`: a directory built once per node (``ParquetTokenDataset``'s token
  shards). Its bytes are reserved (an estimate, evicting least-recently-used unpinned
  entries) before it is built, the reservation set to what ``du`` counts once it is
  published, and the caller gets an :class:`ExternalPin` that keeps it from being
  evicted while the dataset lives (in every process it is pickled into). An evicted
  tree is built again by the next dataset that needs it.
- :class:`FileReservation`: an append-only file (a ``fastload.cached()`` item shard):
  its full size is reserved when it is created (without waiting: an item cache is an
  acceleration, and the caller serves the item uncached when there is no room) and
  sealed READY with its checksum when it is full or closed. Readers pin sealed files
  with :func:`pin` while they hold them open; an evicted file's items are made again.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from fastload.cache import _external
from fastload.cache._external import (
    EXTERNAL_KINDS,
    du_bytes,
    external_name,
    open_pin_file,
    tree_checksum,
)
from fastload.cache.catalog import CatalogBusy, EntryState, blocks
from fastload.cache.disk import DiskTier
from fastload.cache.locks import try_flock
from fastload.errors import CacheFullError, FastloadError

__all__ = [
    "EXTERNAL_KINDS",
    "KINDS",
    "ExternalPin",
    "FileReservation",
    "entry_kind",
    "hold_tokens",
    "hold_tree",
    "pin",
    "tier_for",
    "token_estimate",
]

_TIERS: dict[tuple[str, bool, int], tuple[DiskTier, tuple[int, int] | None]] = {}
_TIERS_LOCK = threading.Lock()
_BUILD_DEADLINE_S = 7 * 24 * 3600.0  # another process may tokenize a large corpus


def tier_for(cache_dir: str | os.PathLike[str], *, shared: bool = False) -> DiskTier:
    """This process's :class:`DiskTier` over ``cache_dir`` (the catalog whose cap every
    writer shares), made once per process, and again if the directory was removed
    since (``rm -rf cache_dir`` between two datasets of one process: the old tier's
    catalog is then an unlinked file and its lock directory is gone)."""
    root = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    k = (root, shared, os.getpid())
    with _TIERS_LOCK:
        held = _TIERS.get(k)
        if held is not None:
            tier, made = held
            if made is not None and made == _catalog_identity(tier) and tier.lock_dir.is_dir():
                return tier
            with suppress(Exception):
                tier.close()
        tier = DiskTier(root, shared=shared, sweep=False)
        _TIERS[k] = (tier, _catalog_identity(tier))
        return tier


def _catalog_identity(tier: DiskTier) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``tier``'s catalog file, None when it is gone."""
    try:
        st = os.stat(tier.root / "catalog.sqlite")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class ExternalPin:
    """A hold on an external entry: while any process holds one, the entry is not
    evicted. Pickles as the entry (the unpickled copy pins it again); released by
    :meth:`release`, or when it is collected."""

    def __init__(self, lock_dir: Path, name: str, fd: int) -> None:
        self.lock_dir, self.name, self.fd = lock_dir, name, fd
        self._pid = os.getpid()

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0 and self._pid == os.getpid():
            with suppress(OSError):
                os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"lock_dir": self.lock_dir, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.lock_dir, self.name = state["lock_dir"], state["name"]
        self._pid = os.getpid()
        self.fd = _shared_lock(self.lock_dir, self.name)

    def __del__(self) -> None:
        # at interpreter exit this module's globals (suppress, os) may already be
        # None: a bare try, which needs no global
        try:  # noqa: SIM105 - contextlib.suppress is a global, maybe gone by then
            self.release()
        except Exception:
            pass


def _shared_lock(lock_dir: Path, name: str) -> int:
    """A shared flock on ``name``'s pin file (waits out an evictor's moment), or -1.
    Raises :class:`~fastload.errors.CacheError` naming the cache directory (the parent
    of ``lock_dir``) if locking fails there."""
    pin_file = _external.pin_path(lock_dir, name)
    for attempt in range(50):
        try:
            fd = open_pin_file(lock_dir, name)
        except OSError:
            return -1
        try:
            # still the pin file (an eviction unlinks it once done): else a new one
            if try_flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, lock_dir.parent, pin_file) and (
                os.fstat(fd).st_ino == os.stat(pin_file).st_ino
            ):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        time.sleep(0.002 * (attempt + 1))
    return -1


def pin(tier: DiskTier, kind: str, path: Path) -> ExternalPin | None:
    """Pin the external entry at ``path`` if it is READY (or still being written);
    None when it is absent (never made, or evicted)."""
    name = external_name(kind, _rel(tier, path))
    fd = _shared_lock(tier.lock_dir, name)
    if fd < 0:
        return None
    with tier.catalog.read() as conn:
        row = tier.catalog.row(conn, name)
    if row is None or row.state not in (EntryState.READY, EntryState.FETCHING):
        os.close(fd)
        return None
    if not os.path.lexists(path):
        os.close(fd)
        return None
    return ExternalPin(tier.lock_dir, name, fd)


def _rel(tier: DiskTier, path: Path) -> str:
    return os.path.relpath(os.path.abspath(path), os.path.abspath(tier.root))


def _reserve(tier: DiskTier, kind: str, name: str, rel: str, size: int, room_wait_s: float) -> None:
    """Mark ``name`` FETCHING with ``size`` bytes under the cap (evicting LRU unpinned
    entries, waiting up to ``room_wait_s``), or raise :class:`CacheFullError`."""
    deadline = time.monotonic() + room_wait_s
    delay = 0.005
    while True:
        with tier._txn(tier.lease_s) as conn:
            tier._limit = tier.catalog.cap(conn)
            _, _, fits = tier._make_room(conn, blocks(size), exclude=name)
            if fits:
                tier.catalog.put(conn, name, f"~{kind}", rel, "", size, EntryState.FETCHING)
                tier.catalog.bump(conn, **{f"{kind}_reserved": 1})
                return
            used = tier.catalog.used(conn)
        if time.monotonic() + delay > deadline:
            raise CacheFullError(
                f"no room for {rel} ({size} bytes, {kind}) in {tier.root} under its cache "
                f"limit of {tier._limit} bytes: {used} bytes are pinned by readers or "
                f"reserved by writers (plus {tier.metadata_bytes()} of metadata); raise "
                "cache_limit"
            )
        time.sleep(delay)
        delay = min(2 * delay, 0.2)


def _seal(tier: DiskTier, kind: str, name: str, rel: str, path: Path, reserved: int) -> None:
    """Set ``name`` READY at what ``du`` counts for ``path`` now, with its checksum;
    room for growth past the reservation is made (CacheFullError when none)."""
    if not os.path.lexists(path):  # removed under its writer (fastload cache clear)
        with tier._txn() as conn:
            tier.catalog.delete(conn, name, EntryState.FETCHING)
        return
    size = du_bytes(path)
    checksum = tree_checksum(path)
    with tier._txn() as conn:
        if size > reserved:
            _, _, fits = tier._make_room(conn, blocks(size) - blocks(reserved), exclude=name)
            if not fits:
                raise CacheFullError(
                    f"{rel} ({kind}) took {size} bytes, more than the {reserved} reserved "
                    f"for it, and no room is left under the cache limit of {tier.root}; "
                    "raise cache_limit"
                )
        tier.catalog.put(conn, name, f"~{kind}", rel, checksum, size, EntryState.READY)
        tier.catalog.bump(conn, **{f"{kind}_sealed": 1})


def hold_tree(
    cache_dir: str | os.PathLike[str],
    kind: str,
    path: Path,
    *,
    estimate: int,
    build: Callable[[], None],
    room_wait_s: float = 60.0,
) -> ExternalPin:
    """Pin the tree ``path`` (under ``cache_dir``) as a ``kind`` entry, building it
    first with ``build()`` when it is absent. The first process reserves ``estimate``
    bytes and holds the entry lock until the tree is sealed; others that arrive
    meanwhile call ``build()`` too (a build that splits its work between processes
    keeps doing so; one that serializes waits inside it), then wait for the seal. A
    tree found on disk but not in the catalog (made before it was accounted) is
    adopted. Raises :class:`CacheFullError` when there is no room for it, whatever
    ``build`` raises."""
    tier = tier_for(cache_dir)
    rel = _rel(tier, path)
    name = external_name(kind, rel)
    flat = _external.flat(name)
    for _ in range(3):
        held = pin(tier, kind, path)
        if held is not None and path.exists():
            return held
        if held is not None:
            held.release()
        with tier.locks.try_hold(flat) as free:
            if free:
                return _reserve_build_seal(tier, kind, name, rel, path, estimate, build,
                                           room_wait_s)  # fmt: skip
        # another process reserved it and builds: join the build, then wait for its seal
        if not path.exists():
            build()
        with tier.locks.hold(flat, time.monotonic() + _BUILD_DEADLINE_S, rel):
            pass
    raise CacheFullError(f"{rel} ({kind}) in {tier.root} was evicted as soon as it was sealed")


def _reserve_build_seal(
    tier: DiskTier,
    kind: str,
    name: str,
    rel: str,
    path: Path,
    estimate: int,
    build: Callable[[], None],
    room_wait_s: float,
) -> ExternalPin:
    """Under the entry lock: reserve, build (unless on disk), seal and pin ``path``."""
    with tier.catalog.read() as conn:
        row = tier.catalog.row(conn, name)
    if row is not None and row.state is EntryState.READY and path.exists():
        held = pin(tier, kind, path)
        if held is not None:
            return held
    if row is not None:  # a dead builder's reservation, or a READY row without its tree
        with tier._txn() as conn:
            _external.evict(tier, conn, name, force=True)
    # a killed builder's work beside the tree (pieces, a build directory) is left to
    # the builder to resume; until then the metadata measures it
    reserved = du_bytes(path) if path.exists() else max(int(estimate), 4096)
    _reserve(tier, kind, name, rel, reserved, room_wait_s)
    try:
        if not path.exists():
            build()
        # pinned before it is READY: no evictor can take it in between
        fd = _shared_lock(tier.lock_dir, name)
        try:
            _seal(tier, kind, name, rel, path, reserved)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        with suppress(Exception), tier._txn() as conn:
            tier.catalog.delete(conn, name, EntryState.FETCHING)
        raise
    return ExternalPin(tier.lock_dir, name, fd)


def hold_tokens(
    cache_dir: str | os.PathLike[str],
    token_dir: Path,
    source_bytes: int,
    itemsize: int,
    build: Callable[[], None],
) -> ExternalPin:
    """:func:`hold_tree` for ``ParquetTokenDataset``'s token directory, tokenized by
    ``build()`` from ``source_bytes`` of parquet into tokens of ``itemsize`` bytes:
    reserved at :func:`token_estimate` while tokenizing."""
    est = token_estimate(source_bytes, itemsize)
    return hold_tree(cache_dir, "tokens", Path(token_dir), estimate=est, build=build)


def token_estimate(source_bytes: int, itemsize: int) -> int:
    """The bytes reserved while ``source_bytes`` of parquet are tokenized into tokens of
    ``itemsize`` bytes: text compressed up to 4x, at most one token per byte of text,
    plus room for the manifest and indexes (set to what was written once published)."""
    return 4 * int(source_bytes) * int(itemsize) + (256 << 10)


def entry_kind(dataset: str, shard: str) -> str:
    """What a catalog entry holds, for ``fastload cache stats``: ``"shards"`` (raw
    shards, parquet files), ``"pixels"`` (decoded-pixel shards), ``"tokens"``
    (``ParquetTokenDataset`` token directories) or ``"items"`` (``cached()`` items)."""
    from fastload.cache.derived import derived_kind

    kind = _external.external_kind(dataset)
    if kind is not None:
        return kind
    return "pixels" if derived_kind(shard) == "px" else "shards"


#: The kinds ``fastload cache stats`` lists, in order (``metadata`` last).
KINDS: tuple[str, ...] = ("shards", "pixels", "tokens", "items", "metadata")


class FileReservation:
    """The reservation of one append-only file: made with :meth:`open` (None when no
    room), sealed with :meth:`seal` (READY at its final size and checksum). The
    writer holds the entry lock in between: a writer that dies leaves a reservation
    the next room-making reclaims, with its file."""

    def __init__(self, tier: DiskTier, kind: str, path: Path, size: int) -> None:
        self.tier, self.kind, self.path, self.size = tier, kind, path, size
        self.rel = _rel(tier, path)
        self.name = external_name(kind, self.rel)
        self._stack = ExitStack()

    @classmethod
    def open(cls, tier: DiskTier, kind: str, path: Path, size: int) -> FileReservation | None:
        """Reserve ``size`` bytes for the file ``path`` (not created here) without
        waiting for room; None when they do not fit under the cap now. Raises
        :class:`FileExistsError` when another process holds the name."""
        r = cls(tier, kind, path, size)
        with r._stack as stack:
            with tier.locks.try_hold(_external.flat(r.name)) as free:
                if not free:
                    raise FileExistsError(f"{path} is being written by another process")
            try:
                stack.enter_context(
                    tier.locks.hold(_external.flat(r.name), time.monotonic() + 5.0, r.rel)
                )
            except FastloadError as exc:  # taken between the probe and the hold
                raise FileExistsError(f"{path} is being written by another process") from exc
            try:
                _reserve(tier, kind, r.name, r.rel, size, 0.0)
            except (CacheFullError, CatalogBusy):
                with suppress(Exception), tier._txn(tier.lease_s) as conn:
                    tier.catalog.bump(conn, **{f"{kind}_no_room": 1})
                return None
            r._stack = stack.pop_all()
        return r

    def cancel(self) -> None:
        """Drop the reservation (nothing was written)."""
        try:
            with suppress(CatalogBusy), self.tier._txn(self.tier.lease_s) as conn:
                self.tier.catalog.delete(conn, self.name, EntryState.FETCHING)
        finally:
            self._stack.close()

    def seal(self) -> None:
        """Publish the file READY at its size now (it is not written again)."""
        try:
            _seal(self.tier, self.kind, self.name, self.rel, self.path, self.size)
        finally:
            self._stack.close()
