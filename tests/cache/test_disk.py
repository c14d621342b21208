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

from .conftest import (
    DATASET,
    SLACK,
    CountingFetch,
    blob,
    capped_tier,
    data_files,
    key_for,
    temp_files,
)

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
        root = mnt / "cache"  # the mount's own root is 1777: not a trusted directory
        tier = DiskTier(root)
        data = blob(9, 2 * 2**20)
        with pytest.raises(CacheError, match="no space left") as info:
            tier.get(key_for(data), len(data), CountingFetch(data))
        assert str(root) in str(info.value)
        assert data_files(root) == {}
        assert temp_files(root) == []
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


E = 64 * 1024  # entry size in the cap tests: 16 blocks, more than the tiers' SLACK


def test_lru_eviction_respects_cap_and_recency(cache_dir: Path) -> None:
    tier = capped_tier(cache_dir, 3 * E)
    blobs = [blob(20 + i, E) for i in range(4)]
    keys = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(blobs)]
    for k, b in zip(keys[:3], blobs[:3], strict=True):
        tier.get(k, E, CountingFetch(b))
    tier.get(keys[0], E, CountingFetch(blobs[0]))  # 0 is now the most recent
    tier.get(keys[3], E, CountingFetch(blobs[3]))
    assert {e.shard for e in tier.entries()} == {
        "shard-000000.tar",
        "shard-000002.tar",
        "shard-000003.tar",
    }
    s = tier.stats()
    assert (s.evictions, s.bytes_evicted, s.bytes_used) == (1, E, 3 * E)
    assert sum(data_files(cache_dir).values()) == 3 * E
    usage = tier.usage()
    assert usage["total"] is not None
    assert usage["cap"] is not None
    assert usage["total"] <= usage["cap"]


def test_pinned_entries_are_never_evicted_and_a_fetch_that_cannot_fit_waits_then_fails(
    cache_dir: Path,
) -> None:
    tier = capped_tier(cache_dir, 2 * E, room_wait_s=0.3)
    blobs = [blob(30 + i, E) for i in range(3)]
    keys = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(blobs)]
    with (
        tier.pinned(keys[0], E, CountingFetch(blobs[0])) as p0,
        tier.pinned(keys[1], E, CountingFetch(blobs[1])),
    ):
        assert [e.pins for e in tier.entries()] == [1, 1]
        third = CountingFetch(blobs[2])
        # a hard cap: both pinned survive and the new one is refused, before any fetch
        with pytest.raises(CacheFullError, match="pinned by readers"):
            tier.get(keys[2], E, third)
        assert third.calls == 0
        assert len(data_files(cache_dir)) == 2
        assert p0.read_bytes() == blobs[0]
    # released: the least recently used unpinned entry (shard 0) makes room
    tier.get(keys[2], E, CountingFetch(blobs[2]))
    assert [(e.shard, e.pins) for e in tier.entries()] == [
        ("shard-000001.tar", 0),
        ("shard-000002.tar", 0),
    ]
    assert sum(data_files(cache_dir).values()) == 2 * E
    assert tier.stats().evictions == 1


def test_a_lowered_cap_is_trimmed_to_when_pins_are_released(cache_dir: Path) -> None:
    tier = capped_tier(cache_dir, 2 * E)
    blobs = [blob(35 + i, E) for i in range(2)]
    keys = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(blobs)]
    tier.get(keys[1], E, CountingFetch(blobs[1]))
    lower = tier.metadata_bytes(least=True) + SLACK + E
    with tier.pinned(keys[0], E, CountingFetch(blobs[0])):
        other = DiskTier(cache_dir, cache_limit=lower)
        # the new cap is stored for every process; the unpinned entry went at once
        assert [e.shard for e in tier.entries()] == ["shard-000000.tar"]
        other.close()
        assert DiskTier(cache_dir).limit == lower


def test_pins_of_a_dead_process_are_ignored(cache_dir: Path) -> None:
    data, other = blob(40, E), blob(41, E)
    key = key_for(data)
    DiskTier(cache_dir).get(key, E, CountingFetch(data))
    child = textwrap.dedent(
        f"""
        import os, signal
        from fastload.cache import DiskTier, EntryKey
        tier = DiskTier({str(cache_dir)!r})
        key = EntryKey({key.dataset!r}, {key.shard!r}, {key.checksum!r})
        tier.get(key, {E}, lambda f: None, pin=True)
        print(tier.entries()[0].pins, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", child], env=env, timeout=60, capture_output=True, text=True
    )
    assert done.returncode == -9
    assert done.stdout.strip() == "1"  # it was pinned while the child lived
    tier = capped_tier(cache_dir, E)
    assert tier.entries()[0].pins == 0
    tier.get(key_for(other, "shard-000001.tar"), E, CountingFetch(other))
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
        DiskTier(cache_dir)  # sweeps tmp/ at start (cheap: no scan of data/)
        assert not dead_tmp.exists()
        assert orphan.exists()
        assert live_tmp.exists()
        found = first.leftovers()
        assert found["orphan_files"] == ["data/0123456789abcdef/ff-shard.tar"]
        assert found["temp_files"] == []  # the live one's lock is held
    finally:
        release.set()
        t.join(10)
    assert first.sweep(full=True) == {
        "temp_files": 1,
        "stale_rows": 0,
        "orphan_files": 1,
        "evicted": 0,
    }
    assert not orphan.exists()
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


def _set_boot(tier: DiskTier, name: str, boot: str | None) -> None:
    """What the catalog holds for an entry published unsynced in another boot."""
    with tier.catalog.txn() as conn:
        conn.execute("UPDATE entries SET boot=? WHERE name=?", (boot, name))


def test_unsynced_entries_are_rehashed_once_after_a_reboot(cache_dir: Path) -> None:
    torn, intact = blob(21, 8192), blob(22, 8192)
    tier = DiskTier(cache_dir)
    assert tier.boot is not None
    assert not tier.sync_publish
    torn_key, intact_key = key_for(torn), key_for(intact, "shard-000001.tar")
    torn_path = tier.get(torn_key, len(torn), CountingFetch(torn))
    tier.get(intact_key, len(intact), CountingFetch(intact))
    with tier.catalog.read() as conn:
        rows = {r.shard: r for r in tier.catalog.rows(conn)}
    assert {r.boot for r in rows.values()} == {tier.boot}  # published without fsync
    # within the same boot, an entry is trusted as published: no re-hash
    assert tier.get(torn_key, len(torn), CountingFetch(torn)) == torn_path
    assert tier.counters().reboot_checks == 0
    # a power cut lost the tail of one file's pages, and the machine rebooted
    _set_boot(tier, torn_key.name, "an-earlier-boot")
    _set_boot(tier, intact_key.name, "an-earlier-boot")
    raw = bytearray(torn_path.read_bytes())
    raw[4096:] = bytes(4096)
    torn_path.write_bytes(bytes(raw))
    after = DiskTier(cache_dir)
    refetch = CountingFetch(torn)
    assert after.get(torn_key, len(torn), refetch).read_bytes() == torn
    assert refetch.calls == 1
    kept = CountingFetch(intact)
    assert after.get(intact_key, len(intact), kept).read_bytes() == intact
    assert kept.calls == 0
    assert after.counters().reboot_checks == 2
    assert after.lifetime_counters()["corrupt"] == 1
    with after.catalog.read() as conn:
        row = after.catalog.row(conn, intact_key.name)
    assert row is not None
    assert row.boot is None
    after.get(intact_key, len(intact), kept)
    assert after.counters().reboot_checks == 2  # checked once


def test_sync_publish_entries_carry_no_boot_tag(cache_dir: Path) -> None:
    data = blob(23, 4096)
    tier = DiskTier(cache_dir, sync_publish=True)
    tier.get(key_for(data), len(data), CountingFetch(data))
    with tier.catalog.read() as conn:
        row = tier.catalog.row(conn, key_for(data).name)
    assert row is not None
    assert row.boot is None


@pytest.mark.parametrize(
    ("sync_publish", "boot_readable", "fsyncs", "tagged"),
    [(False, True, 0, True), (True, True, 2, False), (False, False, 2, False)],
    ids=["default", "sync_publish", "no-boot-id"],
)
def test_fsync_on_publish_only_when_asked_or_without_a_boot_id(
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    sync_publish: bool,
    boot_readable: bool,
    fsyncs: int,
    tagged: bool,
) -> None:
    """The publish of a second entry of a dataset (its directory exists already):
    no fsync by default; the file and its directory with ``sync_publish=True`` or
    where the boot id cannot be read (nothing to re-check against after a reboot)."""
    import fastload.cache.disk as disk

    if not boot_readable:
        monkeypatch.setattr(disk, "_BOOT_ID", cache_dir / "no-such-boot-id")
    first, second = blob(25, 4096), blob(26, 4096)
    tier = DiskTier(cache_dir, sync_publish=sync_publish)
    assert tier.sync_publish is (sync_publish or not boot_readable)
    tier.get(key_for(first), len(first), CountingFetch(first))
    calls: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    key = key_for(second, "shard-000001.tar")
    assert tier.get(key, len(second), CountingFetch(second)).read_bytes() == second
    assert len(calls) == fsyncs
    with tier.catalog.read() as conn:
        row = tier.catalog.row(conn, key.name)
    assert row is not None
    assert (row.boot is not None) is tagged


def test_a_catalog_without_the_boot_column_gains_it_and_keeps_its_entries(
    cache_dir: Path,
) -> None:
    data = blob(24, 4096)
    tier = DiskTier(cache_dir)
    tier.get(key_for(data), len(data), CountingFetch(data))
    with tier.catalog.txn() as conn:
        conn.execute("ALTER TABLE entries DROP COLUMN boot")
    tier.close()
    again = DiskTier(cache_dir)
    fetch = CountingFetch(data)
    assert again.get(key_for(data), len(data), fetch).read_bytes() == data
    assert fetch.calls == 0
