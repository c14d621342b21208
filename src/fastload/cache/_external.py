"""External entries of the NVMe tier: files fastload writes under ``cache_dir`` outside
``data/`` (``ParquetTokenDataset``'s token directories, ``fastload.cached()`` item
shards), accounted in the tier's catalog under the same cap (see
:mod:`fastload.cache.external` for the writers' side).

An external entry is a catalog row named ``~<kind>/<32 hex>`` whose ``dataset`` is
``~<kind>`` and whose ``shard`` is the path of its file or directory relative to
``cache_dir``; its size is what ``du`` counts for it (whole blocks of every file, one
block per directory), so the cap's arithmetic is the same as for shards. It is
FETCHING (a reservation) while its writer holds the entry lock, READY once sealed.

**Pins.** A reader pins an external entry by holding a shared ``flock`` on its pin
file ``locks/<flat>.pin`` (the entry itself may be a directory, or a file still
appended to); eviction takes an exclusive ``flock`` on it without blocking and skips
the entry when it cannot, exactly as for shards. The files go once the row's deletion
is committed (the exclusive lock held until then).

This module holds what the tier's rooms (:mod:`fastload.cache._room`,
:mod:`fastload.cache._maintenance`) call for such rows: eviction, reclaiming a dead
writer's reservation, verification, and the bytes of the side directories (the
metadata of the writers: ``cached/<id>/catalog.sqlite``, ``text/sums/``, lock files)
that the cap counts as metadata.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import secrets
import shutil
import sqlite3
import stat
from contextlib import suppress
from pathlib import Path
from typing import Any

from fastload.cache.catalog import BLOCK, Catalog, EntryRow, EntryState
from fastload.cache.locks import try_flock

#: The kinds of external entry and where their files live under ``cache_dir``.
EXTERNAL_KINDS: dict[str, str] = {"tokens": "text/tokens", "items": "cached"}
#: Side directories under ``cache_dir`` whose files not accounted as entries count as
#: metadata (indexes, checksums, the writers' own catalogs and locks).
SIDE_DIRS: tuple[str, ...] = ("text", "cached", "dali-index")
_NAME = re.compile(r"~([a-z]{1,16})/([0-9a-f]{32})")


def is_external(name: str) -> bool:
    """Whether the catalog name ``name`` is an external entry's."""
    m = _NAME.fullmatch(name)
    return bool(m) and m.group(1) in EXTERNAL_KINDS  # type: ignore[union-attr]


def external_name(kind: str, rel: str) -> str:
    """The catalog name of the ``kind`` entry at ``rel`` (relative to ``cache_dir``)."""
    return f"~{kind}/{hashlib.sha256(rel.encode()).hexdigest()[:32]}"


def external_kind(dataset: str) -> str | None:
    """The kind of an entry from its catalog ``dataset`` (None for shards)."""
    if dataset.startswith("~") and dataset[1:] in EXTERNAL_KINDS:
        return dataset[1:]
    return None


def flat(name: str) -> str:
    return name.replace("/", "-", 1)


def entry_path(root: Path, row: EntryRow) -> Path | None:
    """The file or directory of the external ``row``, or None when its recorded path
    is not one fastload writes (outside its kind's directory, ``..``)."""
    kind = external_kind(row.dataset)
    rel = row.shard
    if kind is None or ".." in rel.split("/") or rel.startswith("/"):
        return None
    if not rel.startswith(EXTERNAL_KINDS[kind] + "/"):
        return None
    return root / rel


def pin_path(lock_dir: Path, name: str) -> Path:
    return lock_dir / f"{flat(name)}.pin"


def open_pin_file(lock_dir: Path, name: str) -> int:
    return os.open(
        pin_path(lock_dir, name),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )


def du_bytes(path: Path) -> int:
    """What the cap counts for ``path`` (a file or a tree): whole blocks of each regular
    file, one block per directory; symlinks are not followed (and count a block)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return _blocks(st.st_size)
    total = BLOCK
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            total += BLOCK
            del d
        for f in filenames:
            with suppress(FileNotFoundError):
                total += _blocks(os.lstat(os.path.join(dirpath, f)).st_size)
    return total


def _blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def tree_checksum(path: Path) -> str:
    """A digest over every file under ``path`` (names, sizes and xxh3-128 of the
    contents), or of the file ``path`` itself."""
    from fastload.shards.checksum import Xxh3Hasher

    h = hashlib.sha256()
    if not path.is_dir():
        files = [(path.name, path)]
    else:
        files = sorted((str(p.relative_to(path)), p) for p in path.rglob("*") if p.is_file())
    for rel, p in files:
        x = Xxh3Hasher()
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            while chunk := os.read(fd, 1 << 22):
                x.update(chunk)
        finally:
            os.close(fd)
        h.update(f"{rel}\0{x.nbytes}\0{x.hexdigest_tagged()}\n".encode())
    return "sha256:" + h.hexdigest()


def remove_path(root: Path, path: Path) -> None:
    """Remove the file or tree ``path`` (a tree is first renamed aside, so a reader
    never finds half of it); never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with suppress(FileNotFoundError):
            os.unlink(path)
        return
    aside = path.parent / f".{path.name}.gone.{secrets.token_hex(4)}"
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def evict(tier: Any, conn: sqlite3.Connection, name: str, force: bool = False) -> bool | None:
    """Delete the external entry ``name`` (inside the caller's transaction) unless a
    reader holds its pin; its files go once the deletion is committed."""
    row = Catalog.row(conn, name)
    if row is None:
        return True
    path = entry_path(tier.root, row)
    fd = open_pin_file(tier.lock_dir, name)
    if not force:
        try:
            taken = try_flock(
                fd, fcntl.LOCK_EX | fcntl.LOCK_NB, tier.root, pin_path(tier.lock_dir, name)
            )
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            return None
    Catalog.delete(conn, name)

    def gone() -> None:
        try:
            if path is not None:
                remove_path(tier.root, path)
            with suppress(FileNotFoundError):
                os.unlink(pin_path(tier.lock_dir, name))
        finally:
            os.close(fd)

    tier.catalog.defer(gone, lambda: os.close(fd))
    return True


def reclaim(tier: Any, conn: sqlite3.Connection, name: str) -> int:
    """Drop the external reservation ``name`` and its partial files if its writer is
    gone (nobody holds the entry lock); returns the bytes freed."""
    with tier.locks.try_hold(flat(name)) as free:
        if not free:
            return 0
        row = Catalog.row(conn, name)
        if row is None or row.state is not EntryState.FETCHING:
            return 0
        path = entry_path(tier.root, row)
        if path is not None and row.dataset == "~items":
            # a dead writer's item shard: its items are made again. A tree's build work
            # (token pieces) is left for its builder to resume, measured as metadata
            remove_path(tier.root, path)
        Catalog.delete(conn, name, EntryState.FETCHING)
        with suppress(FileNotFoundError):
            os.unlink(pin_path(tier.lock_dir, name))
        return _blocks(row.size)


def check(tier: Any, row: EntryRow) -> str | None:
    """Why the READY external ``row`` is damaged (None when whole)."""
    path = entry_path(tier.root, row)
    if path is None:
        return f"catalog path {row.shard!r} is not one fastload writes"
    if not os.path.lexists(path):
        return f"{path} is missing"
    if os.path.islink(path):
        return f"{path} is a symlink"
    try:
        got = tree_checksum(path)
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    if got != row.checksum:
        return f"{path} has checksum {got}, expected {row.checksum}"
    return None


#: published token directories (their rows count them) and ones being removed
_TOKEN_DIR = re.compile(r"[0-9a-f]{40}|\.[0-9a-f]{40}\.gone\.[0-9a-f]{8}")
_ITEM_FILE = re.compile(r"items-[0-9]{1,10}-[0-9]{5,10}\.tar")


def _is_entry(rel_dir: str, name: str) -> bool:
    """Whether ``rel_dir/name`` is (or is the build directory of) an external entry,
    whose bytes its catalog row counts."""
    if rel_dir == EXTERNAL_KINDS["tokens"]:
        return bool(_TOKEN_DIR.fullmatch(name))
    parent = os.path.dirname(rel_dir)
    return parent == EXTERNAL_KINDS["items"] and bool(_ITEM_FILE.fullmatch(name))


def side_bytes(root: Path) -> int:
    """Bytes under the side directories that no entry accounts for (the writers'
    catalogs, checksum files, DALI indexes, lock files, build work such as token
    pieces, directories); the trees and files of entries are skipped."""
    total = 0
    for side in SIDE_DIRS:
        top = root / side
        if not os.path.lexists(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = [d for d in dirnames if not _is_entry(rel_dir, d)]
            total += BLOCK
            for f in filenames:
                if _is_entry(rel_dir, f):
                    continue
                with suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total
