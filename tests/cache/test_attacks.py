"""Issue 14's attacks on the shard cache, each written as the attack: a planted file,
a rewritten catalog row or a hostile umask must never make the tier delete, create or
expose anything outside its directory (each of these passed on the old code)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fastload._fs import UnsafePathError
from fastload.cache import DiskTier, EntryState
from fastload.cache.catalog import blocks

from .conftest import CountingFetch, blob, key_for


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_directories_0700_and_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        root = tmp_path / "cache"
        tier = DiskTier(root)
        data = blob(1, 5000)
        path = tier.get(key_for(data), len(data), CountingFetch(data))
        tier.close()
    finally:
        os.umask(old)
    for d in (root, root / "data", root / "tmp", root / "locks", path.parent):
        assert _mode(d) == 0o700, d
    assert _mode(root / "catalog.sqlite") == 0o600
    assert all(_mode(p) == 0o600 for p in (root / "locks").iterdir())
    assert _mode(path) == 0o400  # published files are read-only


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_cache_dir_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "planted"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(UnsafePathError, match=str(root)) as info:
        DiskTier(root)
    assert "chmod 700" in str(info.value)
    if mode == 0o770:  # group-writable: the opt-in for a group that trusts itself
        os.chmod(root, 0o2770)
        DiskTier(root, shared=True).close()


def test_a_cache_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(UnsafePathError, match="owned by uid 12345"):
        DiskTier(root)


def test_a_planted_catalog_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    root = tmp_path / "cache"
    DiskTier(root).close()
    os.chown(root / "catalog.sqlite", 12345, 12345)
    with pytest.raises(UnsafePathError, match="catalog.sqlite"):
        DiskTier(root)


def test_a_symlinked_dataset_dir_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (victim / "ff-shard.tar").write_text("also mine")
    root = tmp_path / "cache"
    DiskTier(root).close()
    (root / "data" / "0123456789abcdef").symlink_to(victim)
    tier = DiskTier(root)  # start-up sweep
    found = tier.leftovers()
    assert found["unexpected"] == ["data/0123456789abcdef"]
    tier.verify(repair=True)
    tier.sweep(full=True)  # `fastload cache verify --repair`: removes the link itself
    tier.clear()
    tier.close()
    assert sorted(p.name for p in victim.iterdir()) == ["ff-shard.tar", "precious.txt"]
    assert not os.path.lexists(root / "data" / "0123456789abcdef")


@pytest.mark.parametrize(
    "name", ["ABS", "../../victim.txt", "0123456789abcdef/../../../victim.txt"]
)
def test_catalog_rows_with_hostile_names_delete_nothing_outside(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    if name == "ABS":
        name = str(victim)
    root = tmp_path / "cache"
    tier = DiskTier(root, cache_limit=10**9)
    with tier.catalog.txn() as conn:  # what a writer of catalog.sqlite could plant
        tier.catalog.put(conn, name, "ds", "s.tar", "xxh3_128:00", 100, EntryState.READY)
    assert tier.clear() == (1, 100)  # the row goes ...
    assert victim.read_text() == "keep me"  # ... the file it names stays
    with tier.catalog.txn() as conn:
        tier.catalog.put(conn, name, "ds", "s.tar", "xxh3_128:00", 60_000, EntryState.READY)
    # LRU eviction of it (a new entry needing room) touches nothing outside either
    data = blob(2, 50_000)
    # room for one entry: the planted row must be evicted for the new one to fit
    tier.set_limit(tier.metadata_bytes(least=True) + 32 * 1024 + blocks(len(data)))
    assert tier.bytes_used() + blocks(len(data)) > (tier.limit or 0)
    tier.get(key_for(data), len(data), CountingFetch(data))
    assert victim.read_text() == "keep me"
    assert [e.name for e in tier.entries()] == [key_for(data).name]
    assert [b.reason for b in tier.verify()] == []
    tier.close()


def test_a_planted_lock_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    DiskTier(root).close()
    data = blob(3, 4000)
    key = key_for(data)
    target = tmp_path / "created-by-the-victim"
    (root / "locks" / f"{key.flat}.lock").symlink_to(target)
    tier = DiskTier(root)
    with pytest.raises(UnsafePathError, match="symlink"):
        tier.get(key, len(data), CountingFetch(data))
    assert not os.path.lexists(target)  # O_CREAT did not follow the link
    tier.close()


def test_a_planted_data_symlink_is_not_served_or_followed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    data = blob(4, 4000)
    key = key_for(data)
    path = tier.get(key, len(data), CountingFetch(data))
    secret = tmp_path / "secret"
    secret.write_bytes(data)  # same bytes, so only the symlink check can refuse it
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(UnsafePathError, match="symlink"):
        tier.get(key, len(data), CountingFetch(data))
    tier.clear()
    assert secret.read_bytes() == data
    tier.close()
