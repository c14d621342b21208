"""Two pods sharing one node cache: two process trees in separate PID namespaces
(``unshare --pid --fork --mount-proc``: each side is PID 1 of its own namespace), one
cache directory, a tiny cap, overlapping shards, one side holding pins.

Liveness is judged by flock, not PIDs: the reader pod's start-up and evictions must not
take the holder's pinned shards (with PIDs, each pod saw the other's PID 1 as itself
or as dead), the cap (measured with ``du``) holds, every byte is right, and each shard
is fetched once on the node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fastload.cache import DiskTier

POD = Path(__file__).resolve().parent / "pod_main.py"
SIZE = 96 * 1024
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare(1) for PID namespaces")
def test_two_pods_share_a_capped_cache_without_evicting_each_others_pins(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    work = tmp_path / "work"
    work.mkdir()
    tier = DiskTier(root)
    # room for 4 shards of 6 beside the metadata: the reader must evict, and only the
    # shards nobody pins may go
    cap = tier.metadata_bytes(least=True) + 32 * 1024 + 4 * SIZE
    tier.set_limit(cap)
    tier.close()
    pods = [
        subprocess.Popen(
            [*UNSHARE, sys.executable, str(POD), role, str(root), str(work)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("holder", "reader")
    ]
    outs = [p.communicate(timeout=180) for p in pods]
    for p, (_, err) in zip(pods, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    holder = json.loads((work / "holder.json").read_text())
    reader = json.loads((work / "reader.json").read_text())
    assert holder["pid"] == reader["pid"] == 1  # really two PID namespaces
    assert holder["intact"] == [True, True]  # pinned shards never evicted
    assert reader["right"] == [True] * 6
    assert max(reader["du"]) <= cap, (reader["du"], cap)
    fetches = Counter(line.split()[0] for line in (work / "fetches").read_text().splitlines())
    assert fetches == Counter({f"shard-{i:06d}.tar": 1 for i in range(6)})
    after = DiskTier(root)
    assert after.verify() == []
    after.close()
