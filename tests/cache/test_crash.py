"""SIGKILL a process at random instants while it fetches: afterwards every entry is
absent or whole, verify passes, leftovers are swept and the next get works."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fastload.cache import DiskTier, EntryState

from .conftest import CountingFetch, blob, data_files, key_for, temp_files

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 12
SIZE = 64 * 1024
SHARDS = {f"shard-{i:06d}.tar": blob(500 + i, SIZE) for i in range(4)}

CHILD = textwrap.dedent(
    """
    import sys, time
    from fastload.cache import DiskTier
    from tests.cache.conftest import blob, capped_tier, key_for
    root, delay = sys.argv[1], float(sys.argv[2])
    tier = capped_tier(root, 3 * {size})
    print("ready", flush=True)
    for i in range(4):
        data = blob(500 + i, {size})
        def fetch(f, data=data):
            for j in range(0, len(data), 4096):
                f.write(data[j : j + 4096])
                f.flush()
                time.sleep(delay)
        with tier.pinned(key_for(data, f"shard-{{i:06d}}.tar"), len(data), fetch) as p:
            assert p.read_bytes() == data
    print("done", flush=True)
    """
).format(size=SIZE)


def _check_consistent(root: Path) -> DiskTier:
    tier = DiskTier(root)  # sweeps at start
    assert temp_files(root) == []
    rows = {e.name: e for e in tier.entries()}
    assert all(e.state in (EntryState.READY, EntryState.FAILED) for e in rows.values()), rows
    ready = {n: e.size for n, e in rows.items() if e.state is EntryState.READY}
    files = data_files(root)
    # every READY row has its whole file; a file may have lost its row to an eviction
    # killed between committing the row's deletion and unlinking the file (the order
    # DiskTier._evict keeps so that no READY row ever lacks its file): such an orphan
    # is never served, a full sweep removes it and the next fetch's rename replaces it
    assert {n: files[n] for n in ready} == ready
    assert tier.verify() == []
    orphans = sorted(set(files) - set(ready))
    for name in files:
        shard = name.split("-", 1)[1]
        assert (root / "data" / name).read_bytes() == SHARDS[shard]  # whole, never torn
    if orphans:
        assert tier.sweep(full=True)["orphan_files"] == len(orphans)
        assert sorted(data_files(root)) == sorted(ready)
    return tier


@pytest.mark.slow
def test_sigkill_during_fetch_leaves_absent_or_whole_entries(cache_dir: Path) -> None:
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    killed = 0
    for _ in range(ROUNDS):
        delay = rng.choice([0.0, 0.0005, 0.002])
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(cache_dir), str(delay)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.25))
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        killed += proc.returncode == -signal.SIGKILL
        _check_consistent(cache_dir)
        if rng.random() < 0.3:
            DiskTier(cache_dir).clear()
    assert killed >= ROUNDS // 2  # most rounds really died mid-way
    tier = _check_consistent(cache_dir)
    for name, data in SHARDS.items():
        assert tier.get(key_for(data, name), SIZE, CountingFetch(data)).read_bytes() == data
