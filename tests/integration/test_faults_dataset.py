"""Whole datasets through injected faults (SeaweedFS behind the TCP fault proxy).

* About 1% of requests reset, stall, answer 503 or are cut short: every sample read
  through ``ShardedDataset`` (disk cache, and RAM tier without one) is still exactly
  what was written, and the faults were really injected and retried.
* A shard that cannot be fetched (every request answered 503) fails every process
  waiting for it with an error naming the object, instead of leaving them waiting;
  once the store answers again, a fresh read succeeds.
"""

from __future__ import annotations

import multiprocessing as mp
import re
from collections import Counter
from pathlib import Path

import pytest
from cache_procs import check_sample, fail_main, object_name, run_children, write_dataset

from fastload.config import FetchConfig, RetryConfig
from fastload.datasets.sharded import ShardedDataset
from fastload.shards.manifest import Manifest
from support.faultproxy import FaultProxy
from support.seaweed import SeaweedServer

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("no_thread_leaks")]

# Short socket timeout (a stalled request is abandoned after 1 s, the proxy holds it for
# stall_s) and tiny backoffs; enough attempts that 1% faults never exhaust them.
TIGHT_RETRY = RetryConfig(
    max_attempts=10, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=1.0, deadline_s=60.0
)
# Small parts, so that one pass over the dataset is a few hundred ranged GETs.
SMALL_PARTS = FetchConfig(
    part_size=8 * 1024, parallel_threshold=16 * 1024, concurrency=4, retry=TIGHT_RETRY
)
# With this seed the proxy's draws put every kind of fault among the first ~110
# requests (reset at 14, truncate 17, slowdown 60, reset 81, stall 108, ...).
FAULT_SEED = 32
ONE_PERCENT = {"reset": 0.0025, "stall": 0.0025, "slowdown": 0.0025, "truncate": 0.0025}


def _dataset(seaweed: SeaweedServer, n: int, size: int, shard_size: str) -> tuple[str, Manifest]:
    url = seaweed.new_url("ds")
    m = write_dataset(
        url, n=n, shard_size=shard_size, storage_options=seaweed.storage_options, size=size
    )
    return url, m


@pytest.mark.parametrize("tier", ["disk", "ram"])
def test_whole_dataset_through_one_percent_faults(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path, tier: str
) -> None:
    n, size = 320, 4000
    url, m = _dataset(seaweed, n, size, "200KB")
    assert len(m.shards) >= 6
    parts = sum(-(-s.bytes // SMALL_PARTS.part_size) for s in m.shards)
    assert parts >= 150  # enough requests for the seeded faults to come up
    assert fault_proxy.stall_s > 3 * TIGHT_RETRY.timeout_s
    fault_proxy.set_faults(**ONE_PERCENT, seed=FAULT_SEED)

    # the manifest comes from the caller, so every request through the proxy is this
    # dataset's store's, and its retry counter accounts for every fault
    ds = ShardedDataset(
        url,
        cache_dir=tmp_path / "cache" if tier == "disk" else None,
        storage_options=fault_proxy.storage_options,
        fetch=SMALL_PARTS,
        manifest=m,
    )
    problems = [check_sample(ds[i], size) for i in range(n)]
    retries = ds.source.store.stats().retries
    io = ds.io_stats()
    ds.close()

    assert problems == [None] * n
    faults = fault_proxy.stats.faults
    assert sum(faults.values()) >= 3, faults
    assert sum(1 for v in faults.values() if v) >= 3, faults
    # a reset may be absorbed by aiohttp's own one resend; the others reach the policy
    assert retries >= faults["stall"] + faults["slowdown"] + faults["truncate"] > 0, (
        retries,
        faults,
    )
    assert io["remote_bytes"] >= m.total_bytes
    assert io["disk_bytes" if tier == "disk" else "ram_bytes"] > 0


# ------------------------------------------------------------- failure wakes waiters

WAITERS = 4
# The deadline, not the attempt count, ends the failing download: it keeps failing for
# about 1.5 s, long enough that the other processes queue for the same entry.
FAILING_RETRY = RetryConfig(
    max_attempts=1000, initial_backoff_s=0.2, max_backoff_s=0.2, timeout_s=5.0, deadline_s=1.5
)
_ATTEMPTS = re.compile(r"failed after (\d+) attempt\(s\)")


@pytest.mark.parametrize("scope", ["shard", "everything"])
def test_failed_download_wakes_every_waiting_process(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path, scope: str
) -> None:
    n, size = 60, 2000
    url, m = _dataset(seaweed, n, size, "40KB")
    first = m.shards[0]
    # "shard": only the shard's GETs fail (its index is fetched fine); "everything": all
    # requests fail, so the first object needed, the shard's index, is the one named
    if scope == "shard":
        fault_proxy.set_faults(
            slowdown=1.0, match=lambda _m, target, _h: object_name(target) == first.name
        )
        failing = first.name
    else:
        fault_proxy.set_faults(slowdown=1.0)
        failing = first.index_name
    ctx = mp.get_context("fork")
    cache = tmp_path / "cache"
    cfg = {
        "url": url,
        "cache_dir": str(cache),
        "storage_options": fault_proxy.storage_options,
        "fetch": FetchConfig(retry=FAILING_RETRY),
        "manifest_json": m.to_json(),
        "sample": 1,
    }
    log_before = len(fault_proxy.log)

    reports = run_children(
        ctx, fail_main, [cfg] * WAITERS, tmp_path, "waiter", ctx.Barrier(WAITERS), timeout_s=90
    )

    failing_url = f"{url}/{failing}"
    for r in reports:
        assert "CacheError" in r["error_types"] or "FetchError" in r["error_types"], r
        assert failing_url in r["message"], r
        assert "SlowDown" in r["message"], r
        assert f"deadline of {FAILING_RETRY.deadline_s:g} s reached" in r["message"], r
    woken = [r for r in reports if "failed in another request" in r["message"]]
    assert woken, [r["message"] for r in reports]
    # single flight held while failing: the GETs are exactly the attempts of the
    # processes that fetched themselves (the woken ones sent none)
    gets = Counter(object_name(r.target) for r in fault_proxy.log[log_before:] if r.method == "GET")
    own = [r for r in reports if r not in woken]
    assert own
    attempts = [int(_ATTEMPTS.findall(r["message"])[-1]) for r in own]
    assert gets[failing] == sum(attempts) >= 2 * len(own)
    assert all(r.status == 503 for r in fault_proxy.log[log_before:] if r.fault)

    # the store answers again: a fresh reader re-fetches instead of repeating the failure
    fault_proxy.set_faults()
    ds = ShardedDataset(
        url, cache_dir=cache, storage_options=fault_proxy.storage_options, manifest=m
    )
    assert [check_sample(ds[i], size) for i in range(n)] == [None] * n
    ds.close()
