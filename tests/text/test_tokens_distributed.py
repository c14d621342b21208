"""Real processes over SeaweedFS: TokenDataset through fastload.DataLoader on
2 nodes x 2 ranks x 2 workers sees every window once, and an elastic resume from
4 ranks to 3 mid-epoch loses and repeats nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from text_helpers import converted_stream, make_corpus, reference_windows, write_jsonl

import fastload
from support.ranks import run_ranks

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
        tuple(w[0]) for w in reference_windows(converted_stream(tokenizer_path, corpus, 2), SEQ_LEN)
    ]
    assert len(set(ref)) == len(ref)  # windows identify themselves by content
    return url, ref


def _run(
    tmp: Path, tag: str, nodes: int, per_node: int, cfg: dict[str, Any]
) -> list[dict[str, Any]]:
    return run_ranks(RANK_MAIN, tmp, tag, nodes, per_node, cfg, timeout=300)


def _windows(results: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return [tuple(w) for r in results for b in r["batches"] for w in b]


#: batches built in DataLoader workers, or by the loader itself (the default collate)
_COLLATES = pytest.mark.parametrize(
    "default_collate", [False, True], ids=["workers", "token-batches"]
)


def _common(url: str, seaweed: Any, seed: int, default_collate: bool) -> dict[str, Any]:
    """What every rank of a job is given, but the batch size."""
    return {"url": url, "seq_len": SEQ_LEN, "storage_options": seaweed.storage_options,
            "seed": seed, "workers": 2, "default_collate": default_collate}  # fmt: skip


@_COLLATES
def test_two_nodes_two_ranks_two_workers_every_window_once(
    token_job: Any, seaweed: Any, tmp_path: Path, default_collate: bool
) -> None:
    url, ref = token_job
    cfg = {**_common(url, seaweed, 3, default_collate), "batch_size": 4}
    results = _run(tmp_path, "job", 2, 2, cfg)
    # with the default collate the loader builds the batches: no worker process
    assert {r["worker_processes"] for r in results} == {0 if default_collate else 2}
    seen = Counter(_windows(results))
    assert max(seen.values()) == 1
    assert set(seen) <= set(ref)
    assert len(seen) == len(ref) // 16 * 16  # global batch 16; the tail is dropped
    assert len({len(r["batches"]) for r in results}) == 1
    assert all(r["states_equal"] for r in results)


@_COLLATES
def test_elastic_resume_four_ranks_to_three(
    token_job: Any, seaweed: Any, tmp_path: Path, default_collate: bool
) -> None:
    url, ref = token_job
    common = _common(url, seaweed, 5, default_collate)
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
