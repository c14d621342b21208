"""``fastload.Mix`` over SeaweedFS in real rank processes with DataLoader worker
processes: 2 ranks x 2 workers stop mid-epoch, 3 ranks x 2 workers resume from the
saved state, and together they yield the uninterrupted stream, ranks disjoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ds_helpers import write_dataset
from mix_helpers import check_source_epochs, within_one_of_share, write_tokens
from mix_rank_main import ids, sources

import fastload
from fastload import World
from support.ranks import run_ranks

RANK_MAIN = Path(__file__).with_name("mix_rank_main.py")
SIZES = [1_200, 720, 480]  # in proportion to the weights: an epoch uses each item once

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def _merge(results: list[dict[str, Any]]) -> list[int]:
    """The ranks' batches interleaved step by step: the global stream in order."""
    out: list[int] = []
    for k in range(max(len(r["batches"]) for r in results)):
        for r in results:
            if k < len(r["batches"]):
                out += r["batches"][k]
    return out


def test_two_ranks_with_workers_resume_on_three_over_seaweed(seaweed: Any, tmp_path: Path) -> None:
    so = seaweed.storage_options
    urls = [seaweed.new_url("mixtok"), seaweed.new_url("mixa"), seaweed.new_url("mixb")]
    write_tokens(urls[0], SIZES[0], 0, shard_size="1KB", storage_options=so)
    write_dataset(urls[1], n=SIZES[1], size=40, shard_size="4KB", storage_options=so)
    write_dataset(urls[2], n=SIZES[2], size=40, shard_size="4KB", storage_options=so)
    cfg = {"urls": urls, "storage_options": so}
    # the uninterrupted stream, read in this process
    ds = fastload.Mix(sources(cfg), weights=[0.5, 0.3, 0.2], seed=7, source_field="source",
                      world=World.single())  # fmt: skip
    full = ids(list(ds))
    assert len(full) == sum(SIZES)
    check_source_epochs(full, SIZES)
    assert within_one_of_share(full, [0.5, 0.3, 0.2]) < 1

    two = {**cfg, "batch_size": 6, "workers": 2, "stop_after": 70}
    before = run_ranks(RANK_MAIN, tmp_path, "two", 1, 2, two, timeout=300)
    assert {r["worker_processes"] for r in before} == {2}
    assert before[0]["state"] == before[1]["state"]
    assert all(r["io"]["remote_bytes"] > 0 for r in before)  # read from SeaweedFS
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(before[0]["state"]))
    three = {**cfg, "batch_size": 4, "workers": 2, "load_state": str(state_path)}
    after = run_ranks(RANK_MAIN, tmp_path, "three", 1, 3, three, timeout=300)
    head, rest = _merge(before), _merge(after)
    assert len(head) == 2 * 70 * 6
    seen = [x for r in before + after for b in r["batches"] for x in b]
    assert len(seen) == len(set(seen))  # no item on two ranks
    assert head + rest == full
