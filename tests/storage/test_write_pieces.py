"""Downloaded bodies land in part files in small writes (storage/direct.py
``write_all``): every byte at its offset, in ``write_piece()``-sized ``pwrite`` calls,
on both body paths, and through the fault proxy's resets, stalls, 503s and cut bodies
(resumed or retried, the checksum taken as the bytes arrive still whole)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from fastload.config import FetchConfig, RetryConfig
from fastload.shards.checksum import Xxh3Hasher, xxh3_128
from fastload.storage import open_store
from fastload.storage.direct import WRITE_PIECE, write_all, write_piece
from support.faultproxy import FaultProxy
from support.seaweed import SeaweedServer

pytestmark = pytest.mark.usefixtures("no_thread_leaks")

RETRY = RetryConfig(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=30.0)
STALL_RETRY = RetryConfig(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)
PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "aiohttp"])
REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")


def _write_syscalls() -> int:
    """Write system calls made by this thread so far (``/proc/thread-self/io``)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw line in /proc/thread-self/io")


def test_write_all_puts_every_byte_at_its_offset_in_small_writes(tmp_path: Path) -> None:
    piece = write_piece()
    assert mmap.PAGESIZE <= piece <= WRITE_PIECE
    if REPORTING_ORDER.exists():  # below the smallest block a VM hands back to its host
        assert piece <= min(32 << 10, (mmap.PAGESIZE << int(REPORTING_ORDER.read_text())) // 2)
    else:
        assert piece == WRITE_PIECE
    data = os.urandom(5 * piece + 123)
    path = tmp_path / "part"
    path.write_bytes(b"\xee" * 1000)
    fd = os.open(path, os.O_RDWR)
    try:
        before = _write_syscalls()
        write_all(fd, memoryview(data), 777)
        calls = _write_syscalls() - before
    finally:
        os.close(fd)
    got = path.read_bytes()
    assert got[:777] == b"\xee" * 777
    assert got[777:] == data
    assert calls == 6  # five whole pieces and the rest: never one write of it all


@PATHS
@pytest.mark.parametrize("fault", [None, "reset", "stall", "slowdown", "truncate"])
def test_a_body_pumped_into_a_file_survives_each_fault_byte_for_byte(
    seaweed: SeaweedServer,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    fault: str | None,
    direct: bool,
) -> None:
    url = seaweed.new_url()
    plain = open_store(url, seaweed.storage_options)
    plain.write_bytes("warm-up", b"")  # the bucket's first write waits for a volume
    retry = STALL_RETRY if fault == "stall" else RETRY
    fetch = FetchConfig(parallel_threshold=64 << 20, retry=retry, direct_reads=direct)
    via = open_store(url, fault_proxy.storage_options, fetch=fetch)
    # not a multiple of the write piece, so the last write of each body is short and
    # a cut lands inside a piece
    data = os.urandom(3 * 2**20 + 4097)
    plain.write_bytes("shard.tar", data)
    # aiohttp resends an idempotent request once by itself after a reset (see
    # test_faults.py): two in a row reach the policy as one retry
    wire = 2 if fault == "reset" and not direct else 1
    if fault is not None:
        fault_proxy.set_faults(
            schedule=dict.fromkeys(range(1, wire + 1), fault), truncate_fraction=(0.3, 0.7)
        )
    dest = tmp_path / "shard.part"
    digest = Xxh3Hasher()
    assert via.download("shard.tar", str(dest), expected_size=len(data), digest=digest) == len(data)
    assert dest.read_bytes() == data
    # hashed as it was written, each byte once, across the resumed response too
    assert (digest.nbytes, digest.hexdigest_tagged()) == (len(data), xxh3_128(data))
    stats = via.stats()
    assert stats.bytes_read == len(data)
    if fault is None:
        assert (stats.requests, stats.retries) == (1, 0)
        assert fault_proxy.stats.body_bytes_to_client == len(data)
        return
    assert fault_proxy.stats.faults[fault] == wire
    assert (stats.requests, stats.retries) == (2, 1)
    if fault == "truncate":
        first, second = fault_proxy.log[0], fault_proxy.log[-1]
        assert 0 < first.body_bytes < len(data)
        assert second.range is not None  # resumed: only the missing bytes asked again
        start = int(second.range.removeprefix("bytes=").split("-")[0])
        assert 0 < start <= first.body_bytes
        assert second.body_bytes == len(data) - start
