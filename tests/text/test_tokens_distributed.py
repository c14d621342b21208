"""Real processes over SeaweedFS: TokenDataset through fastload.DataLoader on
2 nodes x 2 ranks x 2 workers sees every window once, and an elastic resume from
4 ranks to 3 mid-epoch loses and repeats nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from text_helpers import make_corpus, reference_stream, reference_windows, write_jsonl

import fastload
from support.seaweed import free_port

RANK_MAIN = Path(__file__).with_name("token_rank_main.py")
SEQ_LEN = 16

pytestmark = [pytest.mark.s3, pytest.mark.slow]


@pytest.fixture(scope="module")
def token_job(seaweed: Any, tmp_path_factory: pytest.TempPathFactory, tokenizer_path: str) -> Any:
    tmp = tmp_path_factory.mktemp("tokjob")
    corpus = make_corpus(60, seed=11)
    write_jsonl(str(tmp / "a.jsonl"), corpus)
    url = seaweed.new_url("tok")
    fastload.convert.text(str(tmp / "a.jsonl"), url, tokenizer=tokenizer_path, shard_size="1KB",
                          storage_options=seaweed.storage_options)  # fmt: skip
    ref = [
        tuple(w[0]) for w in reference_windows(reference_stream(tokenizer_path, corpus, 2), SEQ_LEN)
    ]
    assert len(set(ref)) == len(ref)  # windows identify themselves by content
    return url, ref


def _run(
    tmp: Path, tag: str, nodes: int, per_node: int, cfg: dict[str, Any]
) -> list[dict[str, Any]]:
    world = nodes * per_node
    port = str(free_port())
    procs, outs = [], []
    for rank in range(world):
        node, local = divmod(rank, per_node)
        out = tmp / f"{tag}-{rank}.json"
        path = tmp / f"{tag}-{rank}-cfg.json"
        path.write_text(
            json.dumps({**cfg, "cache_dir": str(tmp / f"cache-{node}"), "out": str(out)})
        )
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
               "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(RANK_MAIN), str(path)], env=env))
        outs.append(out)
    for p in procs:
        assert p.wait(timeout=300) == 0
    return [json.loads(o.read_text()) for o in outs]


def _windows(results: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return [tuple(w) for r in results for b in r["batches"] for w in b]


@pytest.mark.parametrize("default_collate", [False, True], ids=["workers", "token-batches"])
def test_two_nodes_two_ranks_two_workers_every_window_once(
    token_job: Any, seaweed: Any, tmp_path: Path, default_collate: bool
) -> None:
    url, ref = token_job
    cfg = {"url": url, "seq_len": SEQ_LEN, "storage_options": seaweed.storage_options,
           "seed": 3, "batch_size": 4, "workers": 2,
           "default_collate": default_collate}  # fmt: skip
    results = _run(tmp_path, "job", 2, 2, cfg)
    # with the default collate the loader builds the batches: no worker process
    assert {r["worker_processes"] for r in results} == {0 if default_collate else 2}
    seen = Counter(_windows(results))
    assert max(seen.values()) == 1
    assert set(seen) <= set(ref)
    assert len(seen) == len(ref) // 16 * 16  # global batch 16; the tail is dropped
    assert len({len(r["batches"]) for r in results}) == 1
    assert all(r["states_equal"] for r in results)


@pytest.mark.parametrize("default_collate", [False, True], ids=["workers", "token-batches"])
def test_elastic_resume_four_ranks_to_three(
    token_job: Any, seaweed: Any, tmp_path: Path, default_collate: bool
) -> None:
    url, ref = token_job
    common = {"url": url, "seq_len": SEQ_LEN, "storage_options": seaweed.storage_options,
              "seed": 5, "workers": 2, "default_collate": default_collate}  # fmt: skip
    first = _run(tmp_path, "first", 2, 2, {**common, "batch_size": 3, "stop_after": 4})
    state = first[0]["state"]
    assert all(r["state"] == state for r in first)
    (tmp_path / "state.json").write_text(json.dumps(state))
    resume = {**common, "batch_size": 4, "load_state": str(tmp_path / "state.json")}
    second = _run(tmp_path, "second", 1, 3, resume)
    before, after = _windows(first), _windows(second)
    assert len(before) == 4 * 12
    total = Counter(before) + Counter(after)
    assert max(total.values()) == 1  # nothing repeated
    assert len(total) == len(ref) // 12 * 12  # nothing lost
