"""Room under the cap, for the NVMe tier (:mod:`fastload.cache.disk`): a fetch reserves
its bytes before it starts (:meth:`TierRoom._reserve`), evicting least-recently-used
unpinned entries and reclaiming downloads of dead processes in the same catalog
transaction, or waits for room and then raises :class:`CacheFullError`; the metadata the
cap counts (the catalog with its WAL reserve, the directories); what one write
transaction may add to the WAL, paid for by evicting when a reader holds the WAL at its
reserve (:meth:`TierRoom._txn`); the stored cap (:meth:`TierRoom.set_limit`) and the
usage it counts.

The eviction order is the catalog's ``(state, last_use)`` index, read a page at a time
(:meth:`Catalog.lru_page`); the RAM tier's pure policy is :mod:`fastload.cache.policy`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from fastload.cache import _external
from fastload.cache._entries import EntryKey, TierState, open_dir, valid_name
from fastload.cache.catalog import BLOCK, WAL_LIMIT, Catalog, CatalogBusy, EntryState, blocks
from fastload.cache.locks import try_flock
from fastload.config import parse_size
from fastload.errors import CacheFullError

#: What the catalog may grow by between two measurements (one transaction's new pages).
GROWTH = 16 * 1024
#: What one write transaction of the tier may add to the WAL, paid for by evicting when
#: a reader keeps the WAL at its reserve (measured: up to 36 KiB for a reservation or
#: a publish with evictions, 20 KiB for an LRU touch)
_WAL_TXN = 64 * 1024


class TierRoom(TierState):
    """Reserve, evict and keep the cap (see the module docstring)."""

    def _wal_due(self) -> int:
        """What the next write transaction must have room for beyond its reserve:
        ``_WAL_TXN`` when the WAL is within that of :data:`WAL_LIMIT` and a shrink
        (tried first) left it there because a reader holds it; else 0."""
        if self._limit is None or self.catalog.wal_bytes() + _WAL_TXN <= WAL_LIMIT:
            return 0
        self.catalog.shrink_wal(0.5)
        return _WAL_TXN if self.catalog.wal_bytes() + _WAL_TXN > WAL_LIMIT else 0

    @contextmanager
    def _txn(self, timeout_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """A catalog write transaction that keeps the cap while a reader holds the WAL
        at its reserve (:meth:`_wal_due`): what the write may add to the WAL is paid for
        by evicting LRU unpinned entries inside the transaction."""
        due = self._wal_due()
        evicted = freed = 0
        with self.catalog.txn(timeout_s) as conn:
            if due:
                evicted, freed, _ = self._make_room(conn, due)
            yield conn
        if evicted:
            self._count(evictions=evicted, bytes_evicted=freed)

    def trim_to_cap(self) -> None:
        """After a pin is released: evict down to the cap if pins had held it above (the
        cap was lowered meanwhile). One O(1) read when under the cap."""
        cap = self._limit
        if cap is None:
            return
        with self.catalog.read() as conn:
            # the WAL at its reserve: its growth is shrunk, never paid for with entries
            over = self.catalog.used(conn) + self.metadata_bytes(least=True) > cap
        if over:
            try:
                with self._txn(self.lease_s) as conn:
                    evicted, freed, _ = self._make_room(conn, 0, wal_first=True)
            except CatalogBusy:
                return  # a stopped writer holds the catalog: the next release trims
            self._count(evictions=evicted, bytes_evicted=freed)

    def _reserve(
        self, key: EntryKey, size: int, room_wait_s: float | None = None
    ) -> tuple[int, int]:
        """Mark ``key`` FETCHING, with room for ``size`` bytes under the cap (evicting
        LRU unpinned entries; waiting up to ``room_wait_s`` (default: the tier's) for
        pins and downloads to free some). Returns ``(entries evicted, bytes freed)``.
        Raises :class:`CacheFullError` when no room came."""
        wait_s = self.room_wait_s if room_wait_s is None else room_wait_s
        deadline = time.monotonic() + wait_s
        evicted = freed = 0
        delay = 0.005
        while True:
            # the cap counts the WAL: one near its reserve is shrunk first
            due = self._wal_due()
            # a writer stopped inside its transaction (SIGSTOP) holds the catalog: past
            # the lease, CatalogBusy, and the facade reads the shard uncached
            with self.catalog.txn(self.lease_s) as conn:
                self._limit = self.catalog.cap(conn)
                # a first entry of its dataset also creates data/<dataset>/
                dir_cost = 0 if os.path.lexists(self.path_for(key).parent) else BLOCK
                n, b, fits = self._make_room(conn, blocks(size) + dir_cost + due, exclude=key.name)
                evicted, freed = evicted + n, freed + b
                if fits:
                    self.catalog.put(
                        conn,
                        key.name,
                        key.dataset,
                        key.shard,
                        key.checksum,
                        size,
                        EntryState.FETCHING,
                    )
                    self.catalog.bump(conn, misses=1, fetches=1)
                    self._flush(conn)
                    return evicted, freed
                used = self.catalog.used(conn)
            if time.monotonic() + delay > deadline:
                self._count(evictions=evicted, bytes_evicted=freed)
                held = (
                    f" (its WAL has grown to {self.catalog.wal_bytes()} bytes, near or past "
                    f"its {WAL_LIMIT} reserve: some process keeps a catalog read transaction "
                    "open)"
                    if due
                    else ""
                )
                raise CacheFullError(
                    f"no room for {key} ({size} bytes) in {self.root} under its cache limit "
                    f"of {self._limit} bytes: {used} bytes are pinned by readers or reserved "
                    f"by downloads in progress (plus {self.metadata_bytes()} of metadata{held}) "
                    f"after waiting {wait_s:.1f} s; raise cache_limit or open fewer "
                    "shards at once"
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.2)

    def _make_room(
        self, conn: sqlite3.Connection, need: int, exclude: str = "", wal_first: bool = False
    ) -> tuple[int, int, bool]:
        """Evict LRU unpinned entries (and reclaim downloads of dead processes) so that
        ``need`` more bytes fit under the cap, inside the caller's transaction. Returns
        ``(entries evicted, bytes freed, whether it fits now)``."""
        cap = self._limit
        if cap is None:
            return 0, 0, True
        # room for the catalog to grow by what the coming writes add, so that the
        # metadata measured after them is still under the cap
        over = self.catalog.used(conn) + self.metadata_bytes() + GROWTH + need - cap
        if over <= 0:
            return 0, 0, True
        if wal_first and self.catalog.wal_bytes() > WAL_LIMIT:
            # the WAL outgrew its reserve (readers kept it from resetting): shrinking it
            # (outside this transaction) frees room without evicting anything
            return 0, 0, False
        for name in self.catalog.names_in(conn, EntryState.FETCHING):
            if name != exclude and valid_name(name):
                over -= self._reclaim(conn, name)
            elif name != exclude and _external.is_external(name):
                over -= _external.reclaim(self, conn, name)
        evicted = freed = 0
        after: tuple[int, str] | None = None
        while over > 0:
            page = self.catalog.lru_page(conn, after)
            if not page:
                break
            for name, size, last_use in page:
                after = (last_use, name)
                if name == exclude:
                    continue
                got = self._evict(conn, name)
                if got is not None:
                    evicted += 1
                    freed += size
                    over -= blocks(size)
                    if over <= 0:
                        break
        self.catalog.bump(conn, evictions=evicted, bytes_evicted=freed)
        return evicted, freed, over <= 0

    def _reclaim(self, conn: sqlite3.Connection, name: str) -> int:
        """Drop the FETCHING row ``name`` and its leftovers if its downloader is gone
        (nobody holds the entry lock); returns the blocks freed."""
        flat = name.replace("/", "-", 1)
        with self.locks.try_hold(flat) as free:
            if not free:
                return 0
            row = self.catalog.row(conn, name)
            if row is None or row.state is not EntryState.FETCHING:
                return 0
            self._remove_temp_files(flat)
            with suppress(FileNotFoundError):
                self._unlink_data(name)  # published, then killed before READY
            self.catalog.delete(conn, name, EntryState.FETCHING)
            return blocks(row.size)

    def _remove_temp_files(self, flat: str) -> int:
        removed = 0
        with os.scandir(self.tmp_dir) as it:
            for e in it:
                if e.name.startswith(flat + ".") and e.name.endswith(".part"):
                    with suppress(FileNotFoundError):
                        os.unlink(self.tmp_dir / e.name)
                        removed += 1
        return removed

    def _evict(self, conn: sqlite3.Connection, name: str, force: bool = False) -> bool | None:
        """Unlink entry ``name``'s file and delete its row (inside the caller's
        transaction) unless a reader has it pinned; returns None when pinned. A row
        whose name is not of the shape fastload writes is deleted without touching any
        file (``force`` also drops a pinned entry: only for a corrupt file)."""
        if _external.is_external(name):
            return _external.evict(self, conn, name, force)
        if not valid_name(name):
            Catalog.delete(conn, name)
            return True
        ds, _, base = name.partition("/")
        try:
            dfd = open_dir(self.data_dir / ds)
        except FileNotFoundError:
            Catalog.delete(conn, name)
            return True
        try:
            try:
                fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                Catalog.delete(conn, name)
                return True
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                os.unlink(base, dir_fd=dfd)  # a planted symlink: removed, never followed
                Catalog.delete(conn, name)
                return True
            try:
                if not force and not try_flock(
                    fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.root, self.data_dir / name
                ):
                    os.close(fd)
                    return None
                Catalog.delete(conn, name)
                # the file goes only once the row's deletion is committed: a SIGKILL in
                # between leaves a file without a row (swept as an orphan, replaced by
                # the next fetch's rename), never a READY row without its file; the
                # exclusive lock is held until then, so no reader pins it meanwhile
                ino = os.fstat(fd).st_ino
                keep_dfd = os.dup(dfd)
                self.catalog.defer(
                    lambda: _unlink_same(keep_dfd, base, ino, fd),
                    lambda: _close_both(fd, keep_dfd),
                )
                return True
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(dfd)

    def _unlink_data(self, name: str) -> None:
        ds, _, base = name.partition("/")
        dfd = open_dir(self.data_dir / ds)
        try:
            os.unlink(base, dir_fd=dfd)
        finally:
            os.close(dfd)

    def metadata_bytes(self, least: bool = False) -> int:
        """Bytes of metadata the cap counts: the catalog (its WAL at least at its size
        limit; exactly that with ``least``, the floor after a checkpoint), the lock
        files and the directories."""
        total = 0
        base = os.fspath(self.root / "catalog.sqlite")
        total += self.catalog.db_bytes()
        with suppress(FileNotFoundError):
            total += os.stat(base + "-shm").st_blocks * 512
        total += WAL_LIMIT if least else max(self.catalog.wal_bytes(), WAL_LIMIT)
        for d in (self.root, self.data_dir, self.tmp_dir, self.lock_dir):
            with suppress(FileNotFoundError):
                total += os.lstat(d).st_blocks * 512
        with suppress(FileNotFoundError), os.scandir(self.data_dir) as it:
            for e in it:
                with suppress(FileNotFoundError):
                    total += e.stat(follow_symlinks=False).st_blocks * 512
        # what the other writers keep beside their entries: their catalogs, checksum
        # files, indexes, lock files and directories
        return total + _external.side_bytes(self.root)

    def bytes_used(self) -> int:
        """Bytes the cap counts now: READY entries and downloads in progress (whole
        blocks) plus the metadata."""
        with self.catalog.read() as conn:
            return self.catalog.used(conn) + self.metadata_bytes()

    def headroom(self) -> int:
        """Bytes that can still be added without evicting anything (a large number
        when there is no cap)."""
        if self._limit is None:
            return 2**62
        return max(self._limit - self.bytes_used(), 0)

    def evictable_headroom(self) -> int:
        """Bytes that can be added by evicting entries nobody in *this process* has
        pinned (pins of other processes are found only when evicting; a fetch that
        then does not fit waits for room)."""
        if self._limit is None:
            return 2**62
        self._count()
        mine = sum(blocks(p.size) for ps in self._pins.values() for p in ps)
        with self.catalog.read() as conn:
            fetching = int(self.catalog.meta(conn).get("fetching_bytes") or 0)
        return max(self._limit - mine - fetching - self.metadata_bytes(), 0)

    def usage(self) -> dict[str, int | None]:
        """What the cap counts, in bytes: ``cap``, ``data`` (READY entries and downloads
        in progress, whole blocks), ``metadata``, ``total``; plus ``ready_bytes`` and
        ``fetching_bytes`` (exact sizes)."""
        with self.catalog.read() as conn:
            meta = self.catalog.meta(conn)
        overhead = self.metadata_bytes()
        data = int(meta.get("used") or 0)
        return {
            "cap": meta.get("cap"),
            "data": data,
            "metadata": overhead,
            "total": data + overhead,
            "ready_bytes": int(meta.get("ready_bytes") or 0),
            "fetching_bytes": int(meta.get("fetching_bytes") or 0),
        }

    def set_limit(self, cache_limit: int | str | None) -> None:
        """Store a new cap for every process (None: no cap) and trim down to it (pinned
        entries go when their pins are released)."""
        cap = None if cache_limit is None else parse_size(cache_limit, "cache_limit")
        with self._txn() as conn:
            self.catalog.set_cap(conn, cap)
            self._limit = cap
            evicted, freed, _ = self._make_room(conn, 0, wal_first=True)
        self._count(evictions=evicted, bytes_evicted=freed)


def _unlink_same(dfd: int, base: str, ino: int, fd: int) -> None:
    """Unlink ``base`` in directory ``dfd`` if it is still the inode ``ino`` (a later
    fetch may have renamed a new file into its place), then close both descriptors
    (the last drops the eviction's exclusive lock)."""
    try:
        with suppress(FileNotFoundError):
            if os.stat(base, dir_fd=dfd, follow_symlinks=False).st_ino == ino:
                os.unlink(base, dir_fd=dfd)
    finally:
        os.close(fd)
        os.close(dfd)


def _close_both(fd: int, dfd: int) -> None:
    os.close(fd)
    os.close(dfd)
