"""Reads through the TCP fault proxy: resets, stalls, 503 SlowDown, truncated bodies."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from fastload.config import FetchConfig, RetryConfig
from fastload.errors import FetchError
from fastload.storage import ObjectNotFoundError, ObjectStore, open_store
from support.faultproxy import FaultProxy
from support.seaweed import SeaweedServer

pytestmark = pytest.mark.usefixtures("no_thread_leaks")

# Tiny backoffs. Tests that inject stalls use a socket timeout well below the proxy's
# stall (10 s); the others a generous one, so a loaded CI machine adds no retries.
RETRY = RetryConfig(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=30.0)
STALL_RETRY = RetryConfig(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)


def fetch_config(
    part_size: int = 256 * 1024,
    parallel_threshold: int = 512 * 1024,
    concurrency: int = 4,
    retry: RetryConfig = RETRY,
    direct: bool = True,
) -> FetchConfig:
    return FetchConfig(part_size, concurrency, parallel_threshold, retry, direct_reads=direct)


#: Bodies read over plain HTTP connections (the default) or through aiohttp.
PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "aiohttp"])


def stores(
    seaweed: SeaweedServer, proxy: FaultProxy, fetch: FetchConfig | None = None
) -> tuple[ObjectStore, ObjectStore]:
    """A direct store for uploads and one through the proxy for the reads under test."""
    url = seaweed.new_url()
    direct = open_store(url, seaweed.storage_options)
    # The first write into a new bucket waits for a volume to grow (~1 s, longer than
    # the tests' socket timeout): do it here, not through the proxy.
    direct.write_bytes("warm-up", b"")
    return direct, open_store(url, proxy.storage_options, fetch=fetch or fetch_config())


def test_proxy_passes_traffic_unchanged(seaweed: SeaweedServer, fault_proxy: FaultProxy) -> None:
    direct, via = stores(seaweed, fault_proxy)
    data = os.urandom(300_000)
    via.write_bytes("obj", data)  # PUT through the proxy, keep-alive across requests
    assert direct.read("obj") == data
    assert via.read("obj") == data
    assert via.read_range("obj", 5, 17) == data[5:17]
    assert fault_proxy.stats.requests == 3
    assert fault_proxy.stats.connections <= 2
    assert fault_proxy.stats.body_bytes_to_client == len(data) + 12


@PATHS
@pytest.mark.parametrize("fault", ["reset", "stall", "slowdown", "truncate"])
def test_each_fault_is_retried(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, fault: str, direct: bool
) -> None:
    plain, via = stores(
        seaweed,
        fault_proxy,
        fetch_config(retry=STALL_RETRY if fault == "stall" else RETRY, direct=direct),
    )
    data = os.urandom(200_000)
    plain.write_bytes("obj", data)
    # aiohttp resends an idempotent request once by itself when its connection is reset
    # (no public switch turns that off), so a reset reaches the policy only on the
    # second one in a row; the direct path hands every reset to the policy.
    wire = 2 if fault == "reset" and not direct else 1
    fault_proxy.set_faults(schedule=dict.fromkeys(range(1, wire + 1), fault))
    assert via.read("obj") == data
    assert fault_proxy.stats.faults[fault] == wire
    assert fault_proxy.stats.requests == wire + 1
    assert via.stats().retries == 1
    assert via.stats().requests == 2


def test_many_objects_with_random_faults_complete(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    direct, via = stores(seaweed, fault_proxy, fetch_config(retry=STALL_RETRY))
    objects = {f"obj-{i}": os.urandom(2_000_000 + 1000 * i) for i in range(6)}
    for name, data in objects.items():
        direct.write_bytes(name, data)
    # ~1% of requests faulted at random, plus each kind at least once on a schedule.
    fault_proxy.set_faults(
        reset=0.0025,
        stall=0.0025,
        slowdown=0.0025,
        truncate=0.0025,
        seed=1234,
        schedule={2: "reset", 9: "slowdown", 17: "truncate", 25: "stall"},
    )
    for name, data in objects.items():
        buf = io.BytesIO()
        assert via.download(name, buf) == len(data)
        assert hashlib.sha256(buf.getvalue()).digest() == hashlib.sha256(data).digest()
    faults = fault_proxy.stats.faults
    assert all(faults[k] >= 1 for k in ("reset", "stall", "slowdown", "truncate")), faults
    # Every fault costs one policy retry, except resets aiohttp resent by itself (a
    # loaded machine may add timeouts of its own, so no upper bound).
    assert via.stats().retries >= sum(faults.values()) - faults["reset"]
    assert via.stats().bytes_read >= sum(map(len, objects.values()))


@PATHS
def test_missing_object_is_not_retried(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, direct: bool
) -> None:
    _, via = stores(seaweed, fault_proxy, fetch_config(direct=direct))
    with pytest.raises(ObjectNotFoundError, match="no-such-key"):
        via.read("no-such-key")
    assert fault_proxy.stats.requests == 1
    assert via.stats().retries == 0


@PATHS
def test_permanently_failing_endpoint_gives_fetch_error(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, direct: bool
) -> None:
    _, via = stores(seaweed, fault_proxy, fetch_config(retry=RETRY, direct=direct))
    fault_proxy.set_faults(down=True)
    with pytest.raises(FetchError) as info:
        via.read("anything")
    assert info.value.attempts == RETRY.max_attempts
    assert via.url("anything") in str(info.value)
    assert f"{RETRY.max_attempts} attempt" in str(info.value)
    # Each attempt is two requests on the wire through aiohttp (it resends a reset one
    # once), one on the direct path.
    assert fault_proxy.stats.requests == (1 if direct else 2) * RETRY.max_attempts
    assert seaweed.secret_key not in str(info.value)
    assert seaweed.secret_key not in repr(info.value)
    assert seaweed.secret_key not in repr(via)


def test_deadline_stops_retries_before_max_attempts(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    retry = RetryConfig(
        max_attempts=10_000, initial_backoff_s=0.05, max_backoff_s=0.2, deadline_s=1.0
    )
    _, via = stores(seaweed, fault_proxy, fetch_config(retry=retry))
    fault_proxy.set_faults(slowdown=1.0)
    with pytest.raises(FetchError, match="deadline") as info:
        via.read("anything")
    assert 1 < info.value.attempts < 10_000
    assert fault_proxy.stats.faults["slowdown"] == info.value.attempts


def test_truncation_resumes_at_the_missing_byte(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    direct, via = stores(seaweed, fault_proxy, fetch_config(parallel_threshold=64 * 2**20))
    data = os.urandom(4_000_000)
    direct.write_bytes("obj", data)
    fault_proxy.set_faults(schedule={1: "truncate"}, truncate_fraction=(0.4, 0.6))
    buf = io.BytesIO()
    assert via.download("obj", buf, expected_size=len(data)) == len(data)
    assert buf.getvalue() == data
    first, second = fault_proxy.log
    assert first.fault == "truncate"
    assert 0 < first.body_bytes < len(data)
    # The retry asks only for what is missing. It starts exactly where the cut was when
    # the client had read every forwarded byte before the close (the proxy lingers for
    # that); aiohttp may drop bytes still buffered when it sees the close, never more.
    assert second.range is not None
    start = int(second.range.removeprefix("bytes=").split("-")[0])
    assert second.range == f"bytes={start}-{len(data) - 1}"
    assert 0 < start <= first.body_bytes
    assert second.body_bytes == len(data) - start
    assert fault_proxy.stats.body_bytes_to_client == len(data) + first.body_bytes - start


def test_parallel_part_truncation_resumes_only_that_part(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    direct, via = stores(seaweed, fault_proxy)
    data = os.urandom(2 * 2**20)
    direct.write_bytes("obj", data)
    fault_proxy.set_faults(schedule={3: "truncate"})
    buf = io.BytesIO()
    assert via.download("obj", buf, expected_size=len(data)) == len(data)
    assert buf.getvalue() == data
    assert fault_proxy.stats.faults["truncate"] == 1
    assert fault_proxy.stats.requests == 8 + 1  # 8 parts, one resumed
    resumed = [r for r in fault_proxy.log if r.fault is None and r.range is not None]
    # Only the rest of the cut part crossed the proxy again, not the whole part.
    assert len(data) <= fault_proxy.stats.body_bytes_to_client < len(data) + 256 * 1024
    assert len(resumed) == 8


def test_large_parallel_download_is_byte_identical(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: object
) -> None:
    direct, via = stores(
        seaweed, fault_proxy, fetch_config(part_size=4 * 2**20, parallel_threshold=8 * 2**20)
    )
    data = os.urandom(40 * 2**20)
    direct.write_bytes("big", data)
    dest = os.path.join(str(tmp_path), "big")
    assert via.download("big", dest) == len(data)
    with open(dest, "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    gets = [r for r in fault_proxy.log if r.method == "GET"]
    assert via.stats().retries == 0
    assert len(gets) == 10
    assert len({r.range for r in gets}) == 10
    assert fault_proxy.stats.body_bytes_to_client == len(data)
