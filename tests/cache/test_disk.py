"""DiskTier: publish, hits, keys, verification, cap, failures, sweep (one process)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import DiskTier, EntryKey, EntryState
from fastload.errors import CacheError, CacheFullError, ConfigError

from .conftest import DATASET, CountingFetch, blob, data_files, key_for, temp_files

REPO = Path(__file__).resolve().parents[2]


def test_miss_then_hits_return_verified_file_and_count(cache_dir: Path) -> None:
    data = blob(1, 10_000)
    key = key_for(data)
    fetch = CountingFetch(data)
    tier = DiskTier(cache_dir)
    path = tier.get(key, len(data), fetch)
    assert path.read_bytes() == data
    assert tier.get(key, len(data), fetch) == path
    assert fetch.calls == 1
    s = tier.stats()
    assert (s.misses, s.hits, s.fetches, s.bytes_fetched, s.entries, s.bytes_used) == (
        1,
        1,
        1,
        len(data),
        1,
        len(data),
    )
    assert tier.lifetime_counters()["hits"] == 1
    assert temp_files(cache_dir) == []


def test_entries_are_reused_by_a_new_tier_on_the_same_dir(cache_dir: Path) -> None:
    data = blob(2, 5000)
    DiskTier(cache_dir).get(key_for(data), len(data), CountingFetch(data))
    again = CountingFetch(data)
    tier = DiskTier(cache_dir)
    assert tier.get(key_for(data), len(data), again).read_bytes() == data
    assert again.calls == 0
    assert tier.stats().hits == 1


def test_changed_checksum_is_a_new_entry_never_stale(cache_dir: Path) -> None:
    old, new = blob(3, 4000), blob(4, 4000)
    tier = DiskTier(cache_dir)
    p_old = tier.get(key_for(old), len(old), CountingFetch(old))
    fetch_new = CountingFetch(new)
    p_new = tier.get(key_for(new), len(new), fetch_new)
    assert fetch_new.calls == 1
    assert p_new != p_old
    assert p_new.read_bytes() == new


def test_same_shard_name_in_two_datasets_do_not_collide(cache_dir: Path) -> None:
    data = blob(5, 100)
    tier = DiskTier(cache_dir)
    a = tier.get(key_for(data, dataset="s3://a/ds"), 100, CountingFetch(data))
    b = tier.get(key_for(data, dataset="s3://b/ds"), 100, CountingFetch(data))
    assert a != b
    assert tier.stats().entries == 2


def test_bad_checksum_tag_is_refused() -> None:
    with pytest.raises(ConfigError, match="checksum must look like"):
        EntryKey(DATASET, "shard-000000.tar", "md5:abc")


@pytest.mark.parametrize("bad", ["truncated", "corrupt"])
def test_fetch_that_writes_wrong_bytes_publishes_nothing(cache_dir: Path, bad: str) -> None:
    data = blob(6, 3000)
    wrong = data[:-1] if bad == "truncated" else b"x" + data[1:]
    tier = DiskTier(cache_dir)
    with pytest.raises(CacheError, match=r"shard-000000\.tar") as info:
        tier.get(key_for(data), len(data), CountingFetch(wrong))
    assert "size" in str(info.value) or "checksum" in str(info.value)
    assert data_files(cache_dir) == {}
    assert temp_files(cache_dir) == []
    # a fresh request retries and succeeds
    assert tier.get(key_for(data), len(data), CountingFetch(data)).read_bytes() == data


def test_entry_larger_than_cap_fails_before_fetching(cache_dir: Path) -> None:
    data = blob(7, 2000)
    fetch = CountingFetch(data)
    tier = DiskTier(cache_dir, cache_limit="1KB")
    with pytest.raises(CacheFullError, match="cache limit of 1000 bytes"):
        tier.get(key_for(data), len(data), fetch)
    assert fetch.calls == 0


def test_enospc_from_fetch_is_a_clear_error_and_leaves_nothing(cache_dir: Path) -> None:
    data = blob(8, 3000)

    def fetch(f: BinaryIO) -> None:
        f.write(data[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    tier = DiskTier(cache_dir)
    with pytest.raises(CacheError, match="no space left") as info:
        tier.get(key_for(data), len(data), fetch)
    assert str(cache_dir) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert data_files(cache_dir) == {}
    assert temp_files(cache_dir) == []
    assert [e.state for e in tier.entries()] == [EntryState.FAILED]


def test_enospc_on_a_real_full_filesystem(tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        tier = DiskTier(mnt)
        data = blob(9, 2 * 2**20)
        with pytest.raises(CacheError, match="no space left") as info:
            tier.get(key_for(data), len(data), CountingFetch(data))
        assert str(mnt) in str(info.value)
        assert data_files(mnt) == {}
        assert temp_files(mnt) == []
        small = blob(10, 1000)
        assert tier.get(key_for(small), 1000, CountingFetch(small)).read_bytes() == small
        tier.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_flipped_byte_is_found_by_verify_and_refetched_after_repair(cache_dir: Path) -> None:
    good, other = blob(11, 4096), blob(12, 4096)
    tier = DiskTier(cache_dir)
    path = tier.get(key_for(good), len(good), CountingFetch(good))
    tier.get(key_for(other, "shard-000001.tar"), len(other), CountingFetch(other))
    raw = bytearray(path.read_bytes())
    raw[1234] ^= 0x01
    path.write_bytes(bytes(raw))
    bad = tier.verify()
    assert [b.shard for b in bad] == ["shard-000000.tar"]
    assert "checksum" in bad[0].reason
    assert tier.verify() == bad  # without repair nothing changes
    assert [b.shard for b in tier.verify(repair=True)] == ["shard-000000.tar"]
    assert tier.verify() == []
    refetch = CountingFetch(good)
    assert tier.get(key_for(good), len(good), refetch).read_bytes() == good
    assert refetch.calls == 1


def test_verify_on_open_detects_a_flip_at_get(cache_dir: Path) -> None:
    good = blob(13, 4096)
    tier = DiskTier(cache_dir, verify="open")
    path = tier.get(key_for(good), len(good), CountingFetch(good))
    raw = bytearray(path.read_bytes())
    raw[7] ^= 0x80
    path.write_bytes(bytes(raw))
    refetch = CountingFetch(good)
    assert tier.get(key_for(good), len(good), refetch).read_bytes() == good
    assert refetch.calls == 1
    assert tier.lifetime_counters()["corrupt"] == 1
    assert tier.entries()[0].pins == 0


def test_lru_eviction_respects_cap_and_recency(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir, cache_limit=3000)
    blobs = [blob(20 + i, 1000) for i in range(4)]
    keys = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(blobs)]
    for k, b in zip(keys[:3], blobs[:3], strict=True):
        tier.get(k, 1000, CountingFetch(b))
    tier.get(keys[0], 1000, CountingFetch(blobs[0]))  # 0 is now the most recent
    tier.get(keys[3], 1000, CountingFetch(blobs[3]))
    assert {e.shard for e in tier.entries()} == {
        "shard-000000.tar",
        "shard-000002.tar",
        "shard-000003.tar",
    }
    s = tier.stats()
    assert (s.evictions, s.bytes_evicted, s.bytes_used) == (1, 1000, 3000)
    assert sum(data_files(cache_dir).values()) == 3000


def test_pinned_entries_are_not_evicted_and_cap_exceeds_only_by_pins(cache_dir: Path) -> None:
    tier = DiskTier(cache_dir, cache_limit=2000)
    blobs = [blob(30 + i, 1000) for i in range(3)]
    keys = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(blobs)]
    with (
        tier.pinned(keys[0], 1000, CountingFetch(blobs[0])) as p0,
        tier.pinned(keys[1], 1000, CountingFetch(blobs[1])),
    ):
        assert [e.pins for e in tier.entries()] == [1, 1]
        tier.get(keys[2], 1000, CountingFetch(blobs[2]))
        # both pinned survive; the new one fits only by exceeding the cap by the pins
        assert len(data_files(cache_dir)) == 3
        assert p0.read_bytes() == blobs[0]
    # releasing the pins trims back under the cap: shard 1 is released first (while
    # shard 0 is still pinned) and is then the least recently used unpinned entry
    assert [(e.shard, e.pins) for e in tier.entries()] == [
        ("shard-000000.tar", 0),
        ("shard-000002.tar", 0),
    ]
    assert sum(data_files(cache_dir).values()) == 2000
    assert tier.stats().evictions == 1
    fetch = CountingFetch(blobs[0])
    tier.get(keys[0], 1000, fetch)
    assert fetch.calls == 0


def test_pins_of_a_dead_process_are_ignored(cache_dir: Path) -> None:
    data, other = blob(40, 1000), blob(41, 1000)
    key = key_for(data)
    DiskTier(cache_dir).get(key, 1000, CountingFetch(data))
    child = textwrap.dedent(
        f"""
        import os, signal
        from fastload.cache import DiskTier, EntryKey
        tier = DiskTier({str(cache_dir)!r})
        key = EntryKey({key.dataset!r}, {key.shard!r}, {key.checksum!r})
        tier.get(key, 1000, lambda f: None, pin=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", child], env=env, timeout=60)
    assert done.returncode == -9
    tier = DiskTier(cache_dir, cache_limit=1000)
    assert tier.entries()[0].pins == 0
    tier.get(key_for(other, "shard-000001.tar"), 1000, CountingFetch(other))
    assert [e.shard for e in tier.entries()] == ["shard-000001.tar"]


def test_failed_fetch_is_recorded_and_a_fresh_request_retries(cache_dir: Path) -> None:
    data = blob(50, 500)
    tier = DiskTier(cache_dir)
    failing = CountingFetch(data, fail=RuntimeError("backend said 503"))
    with pytest.raises(CacheError, match="backend said 503") as info:
        tier.get(key_for(data), 500, failing)
    assert isinstance(info.value.__cause__, RuntimeError)
    (entry,) = tier.entries()
    assert entry.state is EntryState.FAILED
    assert "503" in (entry.error or "")
    assert tier.get(key_for(data), 500, CountingFetch(data)).read_bytes() == data
    assert tier.stats().failures == 1


def test_sweep_removes_dead_leftovers_but_not_a_live_download(cache_dir: Path) -> None:
    data = blob(60, 800)
    key = key_for(data)
    first = DiskTier(cache_dir)
    dead_tmp = cache_dir / "tmp" / f"{key.flat}.999999.deadbeef.part"
    dead_tmp.write_bytes(b"partial")
    orphan = cache_dir / "data" / "0123456789abcdef" / "ff-shard.tar"
    orphan.parent.mkdir()
    orphan.write_bytes(b"orphan")
    other = key_for(blob(61, 10), "shard-000001.tar")
    live_tmp = cache_dir / "tmp" / f"{other.flat}.{os.getpid()}.cafecafe.part"
    live_tmp.write_bytes(b"in progress")
    held = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:  # a "live peer" holding the other entry's lock
        with first.locks.hold(other.flat, deadline=float("inf"), what="peer"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold_lock)
    t.start()
    try:
        assert held.wait(10)
        DiskTier(cache_dir)  # sweeps at start
        assert not dead_tmp.exists()
        assert not orphan.exists()
        assert live_tmp.exists()
    finally:
        release.set()
        t.join(10)
    assert first.sweep() == {"temp_files": 1, "stale_rows": 0, "orphan_files": 0, "evicted": 0}
    assert temp_files(cache_dir) == []


def test_clear_keeps_pinned_entries(cache_dir: Path) -> None:
    a, b = blob(70, 300), blob(71, 400)
    tier = DiskTier(cache_dir)
    tier.get(key_for(a), 300, CountingFetch(a))
    with tier.pinned(key_for(b, "shard-000001.tar"), 400, CountingFetch(b)) as pb:
        assert tier.clear() == (1, 300)
        assert pb.exists()
    assert [e.shard for e in tier.entries()] == ["shard-000001.tar"]
    assert tier.clear() == (1, 400)
    assert data_files(cache_dir) == {}
