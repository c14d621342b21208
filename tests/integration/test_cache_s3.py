"""The node-local cache over real S3 (SeaweedFS) with real processes.

* Eight processes (3 spawned + 5 forked; or 8 forked, two of them reading through a
  DataLoader with 2 workers) read a whole dataset at the same moment through one cache
  directory: every shard and index crosses the wire once, not eight times.
* Processes are SIGKILLed at random instants while their downloads are in flight
  (slowed by truncated responses and 503s from the fault proxy): afterwards
  ``fastload cache verify`` passes, a fresh reader gets every sample and fetches exactly
  what was not cached; a flipped byte in a cached shard is found, repaired and re-fetched.
* The reservation of a download whose process was SIGKILLed must stop counting against
  the byte cap of the processes still running.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cache_procs import (
    check_sample,
    fetch_entry_main,
    object_name,
    open_dataset,
    read_main,
    run_children,
    write_dataset,
)

from fastload.cache import DiskTier, EntryKey, EntryState
from fastload.cache.catalog import blocks
from fastload.cli import main as cli_main
from fastload.config import FetchConfig, RetryConfig
from fastload.shards.manifest import Manifest
from fastload.storage import open_store
from support.faultproxy import FaultProxy
from support.seaweed import SeaweedServer

pytestmark = [pytest.mark.s3, pytest.mark.slow]

PROCS = 8


def _dataset(
    seaweed: SeaweedServer, n: int, size: int, shard_size: str
) -> tuple[str, Manifest, int]:
    """Write a dataset straight to SeaweedFS (not through the proxy); returns its URL,
    manifest and the stored manifest.json's size."""
    url = seaweed.new_url("ds")
    m = write_dataset(
        url, n=n, shard_size=shard_size, storage_options=seaweed.storage_options, size=size
    )
    return url, m, open_store(url, seaweed.storage_options).size("manifest.json")


def _gets(proxy: FaultProxy, since: int) -> Counter[str]:
    """GET requests per object name in the proxy's log since record ``since``."""
    return Counter(object_name(r.target) for r in proxy.log[since:] if r.method == "GET")


# ---------------------------------------------------------------- single flight


@pytest.mark.parametrize(
    ("spawned", "loaders"),
    [(3, 0), (0, 2)],
    ids=["3-spawned-5-forked", "8-forked-2-with-dataloader-workers"],
)
def test_eight_processes_fetch_each_shard_once(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path, spawned: int, loaders: int
) -> None:
    n, size = 300, 2000
    url, m, manifest_bytes = _dataset(seaweed, n, size, "100KB")
    assert len(m.shards) >= 8
    cache = tmp_path / "cache"
    if loaders:
        import torch.utils.data  # noqa: F401 - imported once here, shared by forked readers
    # ranks 0..spawned-1 are spawned, the others forked; ranks 0..loaders-1 of the forked
    # ones read through a DataLoader with 2 workers (themselves forked from the reader)
    ctxs = [mp.get_context("spawn" if r < spawned else "fork") for r in range(PROCS)]
    cfgs = [
        {
            "url": url,
            "cache_dir": str(cache),
            "storage_options": fault_proxy.storage_options,
            "size": size,
            # most start on the same shard (the worst case for single flight)
            "order": ("seq", "seq", "rev", "shuffle")[r % 4],
            "seed": r,
            "workers": 2 if spawned <= r < spawned + loaders else 0,
        }
        for r in range(PROCS)
    ]
    bytes_before = fault_proxy.stats.body_bytes_to_client
    log_before = len(fault_proxy.log)

    barrier = mp.get_context("spawn").Barrier(PROCS)
    reports = run_children(ctxs, read_main, cfgs, tmp_path, "reader", barrier, timeout_s=150)

    for r in reports:
        assert (r["samples"], r["distinct"], r["bad"]) == (n, n, []), r
    shard_bytes = m.total_bytes
    index_bytes = sum(s.index_bytes for s in m.shards)
    wire = fault_proxy.stats.body_bytes_to_client - bytes_before
    assert shard_bytes + index_bytes <= wire
    assert wire <= 1.1 * shard_bytes + PROCS * (index_bytes + manifest_bytes)
    # exactly: one GET per shard and per index, one manifest read per process
    gets = _gets(fault_proxy, log_before)
    assert {s.name: gets[s.name] for s in m.shards} == {s.name: 1 for s in m.shards}
    assert {s.index_name: gets[s.index_name] for s in m.shards} == {
        s.index_name: 1 for s in m.shards
    }
    assert gets["manifest.json"] == PROCS
    assert wire == shard_bytes + index_bytes + PROCS * manifest_bytes
    tier = DiskTier(cache)
    counters = tier.lifetime_counters()
    assert counters["fetches"] == 2 * len(m.shards)
    assert counters.get("failures", 0) == 0
    assert tier.verify() == []
    tier.close()


# ------------------------------------------------------------- SIGKILL rounds

ROUNDS = 6
KILLED_PER_ROUND = 3
# Slow, broken downloads so that kills land while parts are being written: a third of
# the responses are cut short (the proxy lingers 0.2 s before closing), some are 503s.
SLOW_FETCH = FetchConfig(
    part_size=32 * 1024,
    parallel_threshold=64 * 1024,
    concurrency=4,
    retry=RetryConfig(
        max_attempts=40, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0, deadline_s=120
    ),
)


def _kill_round(
    ctx: Any, cfgs: list[dict[str, Any]], kill_after: list[float], tmp: Path, tag: str
) -> list[int]:
    """Start one reader per config and SIGKILL reader k ``kill_after[k]`` seconds after
    the start (if it still runs); returns their exit codes."""
    procs = [
        ctx.Process(target=read_main, args=(cfg, None, str(tmp / f"{tag}-{k}.json")))
        for k, cfg in enumerate(cfgs)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p, after in sorted(zip(procs, kill_after, strict=True), key=lambda pa: pa[1]):
        time.sleep(max(0.0, t0 + after - time.monotonic()))
        p.kill()
    for p in procs:
        p.join(30)
        assert not p.is_alive()
    return [int(p.exitcode or 0) for p in procs]


def test_sigkill_during_downloads_leaves_a_verifiable_cache(
    seaweed: SeaweedServer,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    n, size = 240, 4000
    url, m, _ = _dataset(seaweed, n, size, "120KB")
    assert len(m.shards) >= 7
    cache = tmp_path / "cache"
    tmp_dir = cache / "tmp"
    base = {
        "url": url,
        "cache_dir": str(cache),
        "storage_options": fault_proxy.storage_options,
        "size": size,
        "fetch": SLOW_FETCH,
        "manifest_json": m.to_json(),
    }
    rng = random.Random(20261201)
    ctx = mp.get_context("fork")
    killed = rounds_with_partial_downloads = 0
    for rnd in range(ROUNDS):
        if rnd == ROUNDS // 2:
            # start again from an empty cache, so that later rounds download a lot too
            assert cli_main(["cache", "clear", "--cache-dir", str(cache)]) == 0
        fault_proxy.set_faults(truncate=0.35, slowdown=0.1, seed=rnd)
        cfgs = [
            {**base, "order": ("seq", "rev", "shuffle")[k % 3], "seed": rnd * 10 + k}
            for k in range(KILLED_PER_ROUND)
        ]
        kill_after = [rng.uniform(0.3, 2.5) for _ in cfgs]
        codes = _kill_round(ctx, cfgs, kill_after, tmp_path, f"round{rnd}")
        assert set(codes) <= {0, -signal.SIGKILL}, codes
        killed += codes.count(-signal.SIGKILL)
        # every reader of the round is dead: a temp file now is a download cut by a kill
        rounds_with_partial_downloads += bool(list(tmp_dir.glob("*.part")))
    assert killed >= KILLED_PER_ROUND
    assert rounds_with_partial_downloads >= 1

    fault_proxy.set_faults()
    capsys.readouterr()
    parts = list(tmp_dir.glob("*.part"))
    assert cli_main(["cache", "verify", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert ", found 0 bad" in out
    # the last round's leftovers are reported, not silently swept ...
    assert all(f"tmp/{p.name}" in out for p in parts), out
    assert all(p.exists() for p in parts)
    # ... and removed with --repair
    assert cli_main(["cache", "verify", "--repair", "--cache-dir", str(cache)]) == 0
    assert list(tmp_dir.glob("*.part")) == []
    tier = DiskTier(cache)
    entries = tier.entries()
    tier.close()
    assert {e.state for e in entries} <= {EntryState.READY}, entries
    cached = {e.shard for e in entries}
    missing = sum(s.bytes for s in m.shards if s.name not in cached) + sum(
        s.index_bytes for s in m.shards if s.index_name not in cached
    )

    # a fresh reader gets every sample and fetches exactly what was not cached
    bytes_before = fault_proxy.stats.body_bytes_to_client
    ds = open_dataset({**base, "fetch": None})
    assert [check_sample(ds[i], size) for i in range(n)] == [None] * n
    ds.close()
    assert fault_proxy.stats.body_bytes_to_client - bytes_before == missing

    # one flipped byte in one cached shard: found, dropped, fetched again
    victim = m.shards[len(m.shards) // 2]
    (path,) = (cache / "data").glob(f"*/*-{victim.name}")
    with open(path, "r+b") as f:
        f.seek(victim.bytes // 2)
        byte = f.read(1)
        f.seek(victim.bytes // 2)
        f.write(bytes([byte[0] ^ 0x5A]))
    capsys.readouterr()
    assert cli_main(["cache", "verify", "--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out
    assert victim.name in out
    assert "found 1 bad" in out
    assert cli_main(["cache", "verify", "--repair", "--cache-dir", str(cache)]) == 1
    assert "dropped 1 bad" in capsys.readouterr().out
    assert cli_main(["cache", "verify", "--cache-dir", str(cache)]) == 0

    log_before = len(fault_proxy.log)
    bytes_before = fault_proxy.stats.body_bytes_to_client
    ds = open_dataset({**base, "fetch": None})
    assert [check_sample(ds[i], size) for i in range(n)] == [None] * n
    ds.close()
    refetched = [r for r in fault_proxy.log[log_before:] if r.method == "GET"]
    assert [object_name(r.target) for r in refetched] == [victim.name]
    assert sum(r.body_bytes for r in refetched) == victim.bytes > 0
    assert fault_proxy.stats.body_bytes_to_client - bytes_before == victim.bytes


def test_download_of_a_killed_process_stops_counting_against_the_cap(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A process SIGKILLed mid-download (an OOM-killed DataLoader worker) must not keep
    its reservation: live processes would evict entries to make room for bytes that
    will never arrive, until some process restarts and sweeps."""
    url, m, _ = _dataset(seaweed, 120, 2000, "60KB")
    s0, s1, s2 = m.shards[:3]
    assert s2.bytes <= s0.bytes
    cache = tmp_path / "cache"
    # a live process's tier, opened (and swept) before the other process dies
    tier = DiskTier(cache)
    # room for s0 + s1 besides the metadata (and less than one more shard of slack)
    tier.set_limit(
        tier.metadata_bytes(least=True) + 32 * 1024 + blocks(s0.bytes) + blocks(s1.bytes)
    )
    direct = open_store(url, seaweed.storage_options)
    ds_id = url.rstrip("/")

    # the other process hangs inside the GET of shard 0 (stalled by the proxy), is killed
    fault_proxy.set_faults(stall=1.0, match=lambda _m, target, _h: object_name(target) == s0.name)
    ctx = mp.get_context("fork")
    cfg = {
        "url": url,
        "cache_dir": str(cache),
        "storage_options": fault_proxy.storage_options,
        "fetch": FetchConfig(retry=RetryConfig(timeout_s=60.0)),
        "name": s0.name,
        "size": s0.bytes,
        "checksum": s0.checksum,
    }
    child = ctx.Process(target=fetch_entry_main, args=(cfg, None, str(tmp_path / "child.json")))
    child.start()
    deadline = time.monotonic() + 60
    while fault_proxy.stats.faults["stall"] == 0 or not any(
        e.state is EntryState.FETCHING for e in tier.entries()
    ):
        assert time.monotonic() < deadline, "the child never started its download"
        assert child.is_alive(), child.exitcode
        time.sleep(0.05)
    child.kill()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    def get(shard: Any) -> None:
        tier.get(
            EntryKey(ds_id, shard.name, shard.checksum),
            shard.bytes,
            lambda f: direct.download(shard.name, f, expected_size=shard.bytes),
        )

    get(s1)
    get(s2)  # s1 + s2 <= the cap: nothing needs to go
    ready = {e.shard for e in tier.entries() if e.state is EntryState.READY}
    stats = tier.stats()
    tier.close()
    assert ready == {s1.name, s2.name}, stats
    assert stats.evictions == 0
