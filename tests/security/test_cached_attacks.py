"""Attacks on ``fastload.cached()``: code execution from the cache directory, another
user's planted directory, symlink sprays, world-readable items, stale keys."""

from __future__ import annotations

import os
import pickle
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from fastload._fs import UnsafePathError
from fastload.datasets.cached import (
    CacheKeyWarning,
    cached,
    clear_item_caches,
    item_caches,
)
from fastload.shards.checksum import xxh3_128

from .conftest import ATTACKER, Marker, as_attacker, needs_root


class Items:
    """A deterministic dataset: item ``i`` is a dict of ``scale * i``."""

    def __init__(self, n: int = 8, scale: int = 1) -> None:
        self.n = n
        self.scale = scale
        self.made = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        self.made += 1
        return {"i": i, "value": self.scale * i}


def _plant_pickle(shard: Path, payload: bytes) -> int:
    """Append ``payload`` to ``shard`` as a tar member; return its data offset."""
    info = tarfile.TarInfo("0000000000.pkl")
    info.size = len(payload)
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    with open(shard, "ab") as f:
        start = f.tell()
        f.write(header + payload + b"\0" * (-len(payload) % 512))
    return start + len(header)


def test_rewritten_catalog_row_pointing_at_a_malicious_pickle_never_runs(tmp_path: Path) -> None:
    # The attack: whoever can write in cache_dir appends a pickle that runs code and
    # points item 0's row at it, with the checksum the catalog used to trust.
    ds = cached(Items(), cache_dir=tmp_path / "cache", key="items-v1")
    assert ds[0] == {"i": 0, "value": 0}
    ds.close()
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(Marker(marker))
    shard = next(ds.root.glob("items-*.tar"))
    offset = _plant_pickle(shard, payload)
    with sqlite3.connect(ds.root / "catalog.sqlite") as db:
        db.execute(
            "UPDATE items SET shard=?, offset=?, size=?, checksum=? WHERE i=0",
            (shard.name, offset, len(payload), xxh3_128(payload)),
        )
    victim = cached(Items(), cache_dir=tmp_path / "cache", key="items-v1")
    assert victim[0] == {"i": 0, "value": 0}  # made again, not unpickled
    assert not marker.exists()
    assert victim.stats()["remade"] == 1
    victim.close()


def test_a_row_copied_from_another_item_is_refused(tmp_path: Path) -> None:
    # A genuine item moved to another index (or another cache) does not authenticate.
    ds = cached(Items(), cache_dir=tmp_path / "cache", key="items-v1")
    [ds[i] for i in range(3)]
    ds.close()
    with sqlite3.connect(ds.root / "catalog.sqlite") as db:
        row = db.execute("SELECT shard, offset, size, checksum FROM items WHERE i=2").fetchone()
        db.execute("UPDATE items SET shard=?, offset=?, size=?, checksum=? WHERE i=1", row)
    again = cached(Items(), cache_dir=tmp_path / "cache", key="items-v1")
    assert again[1] == {"i": 1, "value": 1}
    assert again.stats()["remade"] == 1
    again.close()


@needs_root
def test_another_users_planted_cache_directory_is_refused(tmp_path: Path, public_dir: Path) -> None:
    # The attack: in a 1777 parent (like /tmp or a hostPath), another uid creates
    # fastload's predictable item directory with a catalog whose row unpickles code.
    parent = public_dir / "fastload"
    marker = tmp_path / "code-ran"
    victim = cached(Items(), cache_dir=parent, key="imagenet-v1")  # nothing touched yet
    root = victim.root
    payload = pickle.dumps(Marker(marker))

    def plant() -> None:
        root.mkdir(parents=True)
        for d in (parent, parent / "cached", root):
            os.chmod(d, 0o755)  # not even writable by the victim's group
        shard = root / f"items-{os.getpid()}-00000.tar"
        offset = _plant_pickle(shard, payload)
        with sqlite3.connect(root / "catalog.sqlite") as db:
            db.execute(
                "CREATE TABLE items (i INTEGER PRIMARY KEY, shard TEXT NOT NULL, offset INTEGER"
                " NOT NULL, size INTEGER NOT NULL, checksum TEXT NOT NULL)"
            )
            db.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT)")
            db.execute(
                "INSERT INTO items VALUES (0, ?, ?, ?, ?)",
                (shard.name, offset, len(payload), xxh3_128(payload)),
            )

    as_attacker(plant)
    assert root.stat().st_uid == ATTACKER
    with pytest.raises(UnsafePathError, match=f"owned by uid {ATTACKER}") as info:
        victim[0]
    # a cache_dir anyone may write to (like /tmp itself) is refused too
    with pytest.raises(UnsafePathError, match="every local user may write"):
        cached(Items(), cache_dir=public_dir, key="imagenet-v1")[0]
    assert "chmod 700" in str(info.value) or "chown" in str(info.value)
    assert not marker.exists()


@needs_root
def test_shared_opt_in_accepts_a_group_directory_and_still_authenticates(
    public_dir: Path,
) -> None:
    parent = public_dir / "team"
    parent.mkdir(mode=0o2770)
    os.chmod(parent, 0o2770)
    os.chown(parent, ATTACKER, os.getegid())  # a teammate owns it; our group may write
    with pytest.raises(UnsafePathError):
        cached(Items(), cache_dir=parent, key="k")[0]  # private by default
    ds = cached(Items(), cache_dir=parent, key="k", shared=True)
    assert ds[3] == {"i": 3, "value": 3}
    assert stat.S_IMODE(ds.root.stat().st_mode) == 0o2770
    assert {stat.S_IMODE(p.stat().st_mode) for p in ds.root.glob("items-*.tar")} == {0o660}
    ds.close()


def test_directories_0700_and_files_0600_under_umask_0(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ds = cached(Items(), cache_dir=tmp_path / "cache", key="k")
        [ds[i] for i in range(4)]
        ds.close()
    finally:
        os.umask(old)
    for d in (tmp_path / "cache", tmp_path / "cache" / "cached", ds.root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = list(ds.root.iterdir())
    assert any(f.name == "catalog.sqlite" for f in files)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_the_item_key_lives_outside_cache_dir_and_is_private(
    tmp_path: Path, config_dir: Path
) -> None:
    ds = cached(Items(), cache_dir=tmp_path / "cache", key="k")
    ds[0]
    ds.close()
    key = config_dir / "cached-items.key"
    assert key.stat().st_size == 32
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_dir.stat().st_mode) == 0o700
    assert not list((tmp_path / "cache").rglob("*.key"))
    os.chmod(key, 0o644)
    with pytest.raises(UnsafePathError, match="readable by other users"):
        cached(Items(), cache_dir=tmp_path / "cache", key="k")[0]


def test_a_symlink_spray_over_item_file_names_creates_nothing_outside(tmp_path: Path) -> None:
    # The attack: symlinks at the names the victim will create (its pid is
    # predictable) point at a file it must not create.
    ds = cached(Items(), cache_dir=tmp_path / "cache", key="k")
    ds.root.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "cache", 0o700)
    os.chmod(tmp_path / "cache" / "cached", 0o700)
    target_dir = tmp_path / "victim-home" / ".ssh"
    target_dir.mkdir(parents=True)
    for k in range(4):
        os.symlink(target_dir / "authorized_keys", ds.root / f"items-{os.getpid()}-{k:05d}.tar")
    assert ds[1] == {"i": 1, "value": 1}
    assert ds[1] == {"i": 1, "value": 1}
    assert ds.stats()["hits"] == 1
    ds.close()
    assert not (target_dir / "authorized_keys").exists()
    assert os.listdir(target_dir) == []


def test_a_row_with_an_absurd_size_allocates_nothing(tmp_path: Path) -> None:
    ds = cached(Items(), cache_dir=tmp_path / "cache", key="k")
    ds[0]
    ds.close()
    with sqlite3.connect(ds.root / "catalog.sqlite") as db:
        db.execute("UPDATE items SET size=?, offset=0 WHERE i=0", (200 * 2**30,))
    again = cached(Items(), cache_dir=tmp_path / "cache", key="k")
    assert again[0] == {"i": 0, "value": 0}  # no 200 GiB read: refused, remade
    assert again.stats()["remade"] == 1
    again.close()


def test_changed_arguments_under_the_default_key_get_their_own_items(tmp_path: Path) -> None:
    first = cached(Items(scale=1), cache_dir=tmp_path / "cache")
    assert first[5] == {"i": 5, "value": 5}
    first.close()
    second = cached(Items(scale=10), cache_dir=tmp_path / "cache")
    assert second[5] == {"i": 5, "value": 50}  # not the scale=1 item
    second.close()
    third = cached(Items(scale=1), cache_dir=tmp_path / "cache")
    assert third[5] == {"i": 5, "value": 5}
    assert third.stats()["hits"] == 1  # same arguments: the same cache
    third.close()


def test_state_that_cannot_be_fingerprinted_warns_loudly(tmp_path: Path) -> None:
    inner = Items()
    inner.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.warns(CacheKeyWarning, match="dataset.lock"):
        cached(inner, cache_dir=tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached(inner, cache_dir=tmp_path / "cache", key="named-v1")  # a named key: no warning


def test_cache_stats_and_clear_cover_cached_items(tmp_path: Path) -> None:
    from fastload.cache import DiskTier

    cache = tmp_path / "cache"
    DiskTier(cache).catalog.close()
    ds = cached(Items(), cache_dir=cache, key="k")
    [ds[i] for i in range(5)]
    ds.close()
    (infos,) = item_caches(cache)
    assert (infos.key, infos.items) == ("k", 5)
    assert infos.bytes > 0
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "cache", "stats", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"cached()    {ds.root.name}: 5 items" in out
    # a symlink planted where an item cache would be is removed, never followed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    os.symlink(elsewhere, cache / "cached" / ("0" * 20))
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "cache", "clear", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "removed 1 fastload.cached() item caches" in out
    assert not ds.root.exists()
    assert (elsewhere / "keep").read_text() == "x"
    assert item_caches(cache) == []
    assert clear_item_caches(cache) == (0, 0)


def test_honest_items_larger_than_the_shard_size_and_odd_paths_still_hit(tmp_path: Path) -> None:
    class Big(Items):
        def __getitem__(self, i: int) -> Any:
            return bytes([i]) * 5000

    cache = tmp_path / "odd dir?#%"
    ds = cached(Big(), cache_dir=cache, key="big", shard_size="2KB")
    first = [ds[i] for i in range(3)]
    assert [ds[i] for i in range(3)] == first
    assert ds.stats()["hits"] == 3
    ds.close()
    (info,) = item_caches(cache)
    assert info.items == 3
    assert info.problem is None
