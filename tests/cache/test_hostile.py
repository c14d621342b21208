"""Hostile conditions on a real small filesystem (a tmpfs mounted for the test):

* the device fills below the cap (another tenant): a shard that cannot be written is
  read uncached (every byte right, nothing half-written served or left), or refused
  with a clear :class:`CacheFullError` under ``on_full="raise"``; ``verify`` stays
  clean, and once space returns the shards are cached again;
* a read-only cache directory is refused at construction with a clear error.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.cache import DiskTier, ShardCache
from fastload.errors import CacheError, CacheFullError

from .conftest import CountingFetch, blob, data_files, key_for, temp_files

MB = 2**20


class Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 10 MB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, leave: int) -> Path:
    """Fill ``mnt`` with one file until ``leave`` bytes are free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = mnt / "tenant.bin"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return filler


def test_a_device_that_fills_below_the_cap_degrades_and_recovers(tiny_fs: Path) -> None:
    root = tiny_fs / "cache"
    shards = [(f"s{i}.tar", blob(40 + i, MB + 1000 * i)) for i in range(7)]
    cache = ShardCache(root, cache_limit="20MB", room_wait_s=0.1)
    filler = _fill(tiny_fs, 3 * MB)
    cached = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, data in shards:
            with cache.open_shard("ds", Info(name, data), CountingFetch(data)) as s:
                assert bytes(s.data) == data  # never a half-written file
                cached.append(s.path is not None)
    assert cache.disk is not None
    assert not all(cached)  # the device filled: some were read uncached
    assert cache.disk.counters().uncached_reads == cached.count(False)
    assert temp_files(root) == []
    assert cache.disk.verify() == []
    strict = ShardCache(root, room_wait_s=0.1, on_full="raise")
    big = blob(99, 4 * MB)
    with pytest.raises(CacheFullError, match="no space left on the cache device"):
        strict.open_shard("ds", Info("big.tar", big), CountingFetch(big))
    assert temp_files(root) == []
    strict.close()
    # space returns: the next reads are cached again
    filler.unlink()
    for name, data in shards:
        with cache.open_shard("ds", Info(name, data), CountingFetch(data)) as s:
            assert bytes(s.data) == data
            assert s.path is not None
    assert len(data_files(root)) == len(shards)
    assert cache.disk.verify() == []
    cache.close()


def test_a_read_only_cache_dir_is_refused_at_construction(tiny_fs: Path) -> None:
    root = tiny_fs / "cache"
    DiskTier(root).close()
    done = subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], capture_output=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(CacheError, match="cannot be written") as info:
        ShardCache(root)
    assert str(root) in str(info.value)
    with pytest.raises(CacheError):
        DiskTier(tiny_fs / "fresh")  # cannot even be created


_TRUNCATED = """
import os, sys
from fastload import ShardReader, ShardFormatError
path = sys.argv[1]
with ShardReader(path) as reader:
    assert bytes(reader[0]["bin"])
    os.truncate(path, 4096)
    try:
        reader[len(reader) - 1]
    except ShardFormatError as exc:
        print("error", exc.code)
"""


def test_a_mapped_reader_of_a_file_truncated_under_it_gets_an_exception(tmp_path: Path) -> None:
    import sys

    from fastload.shards.writer import ShardWriter

    with ShardWriter(str(tmp_path / "ds"), shard_size="1GB") as w:
        for k in range(20):
            w.write({"__key__": f"{k:03d}", "bin": os.urandom(5000)})
    proc = subprocess.run(
        [sys.executable, "-c", _TRUNCATED, str(tmp_path / "ds" / "shard-000000.tar")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # never SIGBUS
    assert proc.stdout.strip() == "error io"


def test_a_catalog_write_on_a_full_disk_is_a_cache_full_error(tiny_fs: Path) -> None:
    """sqlite's own "database or disk is full" never leaves the catalog (the soak saw it
    raised out of a loader when another tenant filled the disk): a write transaction
    that cannot be written is a CacheFullError naming the catalog, and the catalog
    works again once there is room."""
    from fastload.cache.catalog import Catalog

    catalog = Catalog(tiny_fs / "catalog.sqlite")
    with catalog.txn() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS tenant_test(x BLOB)")
    filler = _fill(tiny_fs, 16 * 1024)
    with pytest.raises(CacheFullError, match=r"catalog\.sqlite.*full"), catalog.txn() as conn:
        conn.execute("INSERT INTO tenant_test VALUES (?)", (b"\1" * 2**20,))
    filler.unlink()
    with catalog.txn() as conn:
        conn.execute("INSERT INTO tenant_test VALUES (?)", (b"\1" * 2**10,))
    with catalog.read() as conn:
        assert conn.execute("SELECT count(*) FROM tenant_test").fetchone()[0] == 1
