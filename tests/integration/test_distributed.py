"""Real processes over SeaweedFS: 2 nodes x 2 ranks x 2 DataLoader workers, and an
elastic resume from 4 ranks to 3 mid-epoch."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "datasets"))
from ds_helpers import write_dataset

from support.ranks import run_ranks

RANK_MAIN = Path(__file__).with_name("rank_main.py")

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def _run_job(
    tmp: Path,
    tag: str,
    nodes: int,
    ranks_per_node: int,
    common: dict[str, Any],
    per_rank: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    cfg = {**common, **(per_rank or {}), "init_method": "env://"}
    return run_ranks(RANK_MAIN, tmp, tag, nodes, ranks_per_node, cfg, timeout=240)


def test_two_nodes_see_every_sample_once_and_fetch_it_once(
    seaweed: Any, fault_proxy: Any, tmp_path: Path
) -> None:
    url = seaweed.new_url("ds")
    m = write_dataset(url, n=256, shard_size="24KB", storage_options=seaweed.storage_options)
    assert len(m.shards) >= 8
    before = fault_proxy.stats.body_bytes_to_client
    common = {
        "url": url,
        "seed": 7,
        "storage_options": fault_proxy.storage_options,
        "batch_size": 8,
        "workers": 2,
        "drop_last": True,
    }
    results = _run_job(tmp_path, "job", nodes=2, ranks_per_node=2, common=common)
    fetched = fault_proxy.stats.body_bytes_to_client - before
    seen = Counter(k for r in results for b in r["batches"] for k in b)
    assert len(seen) == 256
    assert set(seen.values()) == {1}
    counts = {len(r["batches"]) for r in results}
    assert counts == {8}
    assert all(r["all_counts"] == [8, 8, 8, 8] for r in results)
    assert all(r["states_equal"] for r in results)
    # the two nodes together read about the dataset once, not twice
    data = m.total_bytes + sum(s.index_bytes for s in m.shards)
    assert fetched <= 1.3 * data, (fetched, data)
    assert fetched >= 0.9 * m.total_bytes


def test_elastic_resume_four_ranks_to_three(seaweed: Any, tmp_path: Path) -> None:
    url = seaweed.new_url("ds")
    write_dataset(url, n=240, shard_size="24KB", storage_options=seaweed.storage_options)
    common = {
        "url": url,
        "seed": 11,
        "storage_options": seaweed.storage_options,
        "workers": 2,
        "drop_last": True,
    }
    # 4 ranks (2 nodes x 2) x batch 6 = global batch 24; stop after 4 steps
    first = _run_job(tmp_path, "first", 2, 2, {**common, "batch_size": 6}, {"stop_after": 4})
    state = first[0]["state"]
    assert all(r["state"] == state for r in first)
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    # resume on 3 ranks (one node) x batch 8: the same global batch of 24
    second = _run_job(
        tmp_path, "second", 1, 3, {**common, "batch_size": 8}, {"load_state": str(state_path)}
    )
    before = [k for r in first for b in r["batches"] for k in b]
    after = [k for r in second for b in r["batches"] for k in b]
    assert len(before) == 4 * 24
    assert not set(before) & set(after)  # nothing repeated
    assert len(after) == len(set(after))
    assert sorted(before + after) == sorted(f"s{i:05d}" for i in range(240))  # nothing lost
    assert {len(r["batches"]) for r in second} == {(240 - 96) // 24}
