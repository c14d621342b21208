"""Maintenance of the NVMe tier (:mod:`fastload.cache.disk`): :meth:`verify` re-hashes
every READY entry, :meth:`clear` drops what is not pinned or downloading,
:meth:`leftovers` lists what crashed processes left and :meth:`sweep` removes it (the
cheap part at start-up: part files and FETCHING rows whose entry lock nobody holds).
Everything here scans and never follows a symlink.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from fastload.cache import _external
from fastload.cache._entries import DATASET_DIR, BadEntry, fd_checksum, valid_name
from fastload.cache._room import TierRoom
from fastload.cache.catalog import WAL_LIMIT, EntryRow, EntryState


class TierMaintenance(TierRoom):
    """Verify, clear, list and sweep leftovers (see the module docstring)."""

    def verify(self, repair: bool = False) -> list[BadEntry]:
        """Re-hash every READY entry; return the damaged ones (missing file, wrong size
        or checksum, not a regular file, a name fastload never writes). With
        ``repair=True`` they are dropped, so the next get re-fetches."""
        bad: list[BadEntry] = []
        with self.catalog.read() as conn:
            rows = self.catalog.rows(conn, EntryState.READY)
        deadline = time.monotonic() + self.wait_deadline_s
        for row in rows:
            reason = self._check_entry(row)
            if reason is None:
                continue
            bad.append(BadEntry(row.name, row.dataset, row.shard, reason))
            if repair:
                with (
                    self.locks.hold(row.name.replace("/", "-", 1), deadline, row.name),
                    self._txn() as conn,
                ):
                    current = self.catalog.row(conn, row.name)
                    if current is not None and current.state is EntryState.READY:
                        self._evict(conn, row.name, force=True)
                        self.catalog.bump(conn, corrupt=1)
        return bad

    def _check_entry(self, row: EntryRow) -> str | None:
        if _external.is_external(row.name):
            return _external.check(self, row)
        if not valid_name(row.name):
            return f"catalog name {row.name!r} is not one fastload writes"
        path = self.data_dir / row.name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return f"file {path} is missing"
        except OSError as exc:
            return f"file {path} cannot be opened: {exc}"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"{path} is not a regular file"
            got_size, got = fd_checksum(fd)
        finally:
            os.close(fd)
        if got_size != row.size:
            return f"file {path} is {got_size} bytes, expected {row.size}"
        if got != row.checksum:
            return f"file {path} has checksum {got}, expected {row.checksum}"
        return None

    def clear(self) -> tuple[int, int]:
        """Remove every unpinned READY entry and every FAILED record; downloads in
        progress and pinned entries stay. Returns ``(entries removed, bytes freed)``."""
        removed = freed = 0
        with self._txn() as conn:
            for row in self.catalog.rows(conn):
                if row.state is EntryState.FAILED:
                    self.catalog.delete(conn, row.name)
                elif row.state is EntryState.READY and self._evict(conn, row.name):
                    removed += 1
                    freed += row.size
        return removed, freed

    def leftovers(self) -> dict[str, list[str]]:
        """What crashed or killed processes left, without removing anything: temp files
        and FETCHING rows whose lock nobody holds (``temp_files``, ``stale_rows``),
        data files with no READY row (``orphan_files``), and anything that is not a
        regular file or directory of fastload's shape under ``data/`` and ``tmp/``
        (``unexpected``: symlinks, planted names). Never follows a symlink."""
        out: dict[str, list[str]] = {
            "temp_files": [],
            "stale_rows": [],
            "orphan_files": [],
            "unexpected": [],
        }
        with os.scandir(self.tmp_dir) as it:
            for e in it:
                if not e.is_file(follow_symlinks=False) or not e.name.endswith(".part"):
                    out["unexpected"].append(f"tmp/{e.name}")
                    continue
                with self.locks.try_hold(e.name.rsplit(".", 3)[0]) as free:
                    if free:
                        out["temp_files"].append(f"tmp/{e.name}")
        with self.catalog.read() as conn:
            fetching = self.catalog.names_in(conn, EntryState.FETCHING)
            ready = set(self.catalog.names_in(conn, EntryState.READY))
        for name in fetching:
            with self.locks.try_hold(name.replace("/", "-", 1)) as free:
                if free:
                    out["stale_rows"].append(name)
        busy = set(fetching)
        with os.scandir(self.data_dir) as it:
            for d in it:
                if not d.is_dir(follow_symlinks=False) or not DATASET_DIR.fullmatch(d.name):
                    out["unexpected"].append(f"data/{d.name}")
                    continue
                with os.scandir(self.data_dir / d.name) as files:
                    for f in files:
                        name = f"{d.name}/{f.name}"
                        if not f.is_file(follow_symlinks=False) or not valid_name(name):
                            out["unexpected"].append(f"data/{name}")
                        elif name not in ready and name not in busy:
                            out["orphan_files"].append(f"data/{name}")
        return out

    def sweep(self, full: bool = False) -> dict[str, int]:
        """Clean up after crashed processes: temp files and FETCHING rows whose entry
        lock nobody holds, and bytes over the cap. With ``full`` (``fastload cache
        verify --repair``) also data files with no READY row, READY rows whose file
        is gone, and anything unexpected under ``data/`` and ``tmp/`` (a symlink is
        removed, never followed). Start-up runs the cheap part: it reads only ``tmp/``
        and the FETCHING rows. Returns counts of what was removed."""
        report = {"temp_files": 0, "stale_rows": 0, "orphan_files": 0, "evicted": 0}
        with os.scandir(self.tmp_dir) as it:
            temps = [e.name for e in it]
        for tname in temps:
            flat = tname.rsplit(".", 3)[0]
            ok = tname.endswith(".part")
            with self.locks.try_hold(flat) if ok else _yes() as free:
                if free and (ok or full):
                    with suppress(FileNotFoundError):
                        os.unlink(self.tmp_dir / tname)
                        report["temp_files"] += 1
        with self.catalog.read() as conn:
            fetching = self.catalog.names_in(conn, EntryState.FETCHING)
        for name in fetching:
            with self._txn(self.lease_s) as conn:
                if _external.is_external(name):
                    if _external.reclaim(self, conn, name):
                        report["stale_rows"] += 1
                elif not valid_name(name):
                    self.catalog.delete(conn, name, EntryState.FETCHING)
                    report["stale_rows"] += 1
                elif self._reclaim(conn, name):
                    report["stale_rows"] += 1
                elif self.catalog.row(conn, name) is None:
                    report["stale_rows"] += 1  # an empty reservation (size 0)
        if full:
            found = self.leftovers()
            for rel in found["orphan_files"] + found["unexpected"]:
                if not rel.startswith("data/"):
                    continue
                name = rel[len("data/") :]
                with self.locks.try_hold(name.replace("/", "-", 1)) as free:
                    if not free:
                        continue
                    with self._txn(self.lease_s) as conn:
                        cur = self.catalog.row(conn, name)
                        if cur is not None and cur.state is not EntryState.FAILED:
                            continue
                        with suppress(OSError):
                            target = self.data_dir / name
                            if os.path.isdir(target) and not os.path.islink(target):
                                os.rmdir(target)
                            else:
                                os.unlink(target)
                            report["orphan_files"] += 1
            with self.catalog.read() as conn:
                rows = self.catalog.rows(conn, EntryState.READY)
            for row in rows:
                if self._check_entry(row) is not None:
                    try:
                        size = os.lstat(self.data_dir / row.name).st_size
                    except (FileNotFoundError, ValueError):
                        size = -1
                    if _external.is_external(row.name) or size != row.size:
                        with self._txn(self.lease_s) as conn:
                            self._evict(conn, row.name, force=True)
                            report["stale_rows"] += 1
        if self.catalog.wal_bytes() > WAL_LIMIT:
            self.catalog.shrink_wal()  # left by processes that died with it grown
        with self._txn(self.lease_s) as conn:
            self._limit = self.catalog.cap(conn)
            report["evicted"] = self._make_room(conn, 0, wal_first=True)[0]
        return report


@contextmanager
def _yes() -> Iterator[bool]:
    yield True
