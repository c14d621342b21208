"""Rough edges of the token path, each failing on the code before it was fixed:
``collate_packed``'s ``max_seqlen`` is a Python int, and with ``drop_last=False`` no
window is ever repeated (an uneven split leaves the last ranks shorter)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from text_helpers import write_jsonl

import fastload
from fastload import World
from fastload.text.tokens import TokenDataset, collate_packed
from support.resume import resume_halves


@pytest.fixture(scope="module")
def token_url(
    tmp_path_factory: pytest.TempPathFactory, corpus: list[str], tokenizer_path: str
) -> str:
    root = tmp_path_factory.mktemp("tokens")
    write_jsonl(str(root / "src" / "a.jsonl"), corpus)
    fastload.convert.text(
        str(root / "src"), str(root / "out"), tokenizer=tokenizer_path, shard_size="1KB"
    )
    return str(root / "out")


def _ids(batch: list[dict[str, torch.Tensor]]) -> list[tuple[int, ...]]:
    return [tuple(x["input_ids"].tolist()) for x in batch]


@pytest.mark.parametrize("transport", ["cache", "pickle"])
def test_max_seqlen_is_a_python_int(token_url: str, transport: str) -> None:
    ds = TokenDataset(
        token_url,
        seq_len=64,
        shuffle=False,
        world=World.single(),
        position_ids=True,
        cu_seqlens=True,
    )
    batch = collate_packed([ds[0], ds[1], ds[2]])
    assert type(batch["max_seqlen"]) is int
    assert batch["max_seqlen"] == int(torch.diff(batch["cu_seqlens"]).max())
    loader = fastload.DataLoader(
        ds, batch_size=4, collate_fn=collate_packed, transport=transport, world=World.single()
    )
    assert all(type(b["max_seqlen"]) is int for b in loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_rank_without_drop_last_serves_each_window_once(token_url: str, workers: int) -> None:
    """An uneven last batch stays short: n windows stay n (they were padded to a whole
    batch by repeating windows)."""
    ds = TokenDataset(token_url, seq_len=30, shuffle=True, seed=1, world=World.single())
    n, batch = ds.num_windows, 8
    assert n % batch  # the split is uneven
    loader = fastload.DataLoader(
        ds,
        batch_size=batch,
        num_workers=workers,
        collate_fn=_ids,
        transport="pickle",
        world=World.single(),
    )
    seen = Counter(w for b in loader for w in b)
    assert sum(seen.values()) == n == len(ds)
    assert max(seen.values()) == 1
    fast = fastload.DataLoader(ds, batch_size=batch, world=World.single())
    rows = [tuple(r) for b in fast for r in b["input_ids"].tolist()]
    assert len(rows) == n == len(set(rows))


def test_a_shuffled_two_worker_stop_and_resume_serves_each_window_once(token_url: str) -> None:
    def make() -> fastload.DataLoader:
        ds = TokenDataset(token_url, seq_len=30, shuffle=True, seed=4, world=World.single())
        return fastload.DataLoader(
            ds,
            batch_size=8,
            num_workers=2,
            collate_fn=_ids,
            transport="pickle",
            world=World.single(),
        )

    full, head, rest = resume_halves(make, 5)
    assert head + rest == full
    windows = [w for b in head + rest for w in b]
    ds = TokenDataset(token_url, seq_len=30, shuffle=False, world=World.single())
    assert len(windows) == len(set(windows)) == ds.num_windows


@pytest.mark.parametrize("ranks", [3, 7])
def test_uneven_ranks_are_shorter_never_padded(token_url: str, ranks: int) -> None:
    """Over ranks and workers, every window once; the ranks' counts differ by at most
    one batch, and ``len(ds)`` is each rank's own count."""
    seen: Counter[Any] = Counter()
    counts = []
    for rank in range(ranks):
        for worker_count in (0, 2):
            world = World.of(rank=rank, world_size=ranks)
            ds = TokenDataset(token_url, seq_len=30, shuffle=True, seed=2, world=world)
            loader = fastload.DataLoader(
                ds,
                batch_size=4,
                num_workers=worker_count,
                collate_fn=_ids,
                transport="pickle",
                world=world,
            )
            got = [w for b in loader for w in b]
            assert len(got) == len(ds)
            if worker_count == 0:
                seen.update(got)
                counts.append(len(got))
    n = TokenDataset(token_url, seq_len=30, shuffle=False, world=World.single()).num_windows
    assert sum(seen.values()) == n
    assert max(seen.values()) == 1
    assert max(counts) - min(counts) <= 4
    assert len(set(counts)) > 1


@pytest.mark.parametrize("n", [1, 7, 203, 1135])
@pytest.mark.parametrize(("nodes", "ranks", "batch"), [(1, 1, 8), (1, 3, 4), (2, 2, 5), (3, 1, 7)])
def test_pad_none_splits_every_sample_once_over_any_world(
    n: int, nodes: int, ranks: int, batch: int
) -> None:
    """``fastload.sampling``'s ``pad="none"`` (what the token datasets use): over every
    rank of the world, each sample once, and ``rank_samples(slot=)`` each rank's count;
    also mid-epoch after whole global steps."""
    from fastload.sampling import plan_rank, rank_samples

    counts = [n // 4, n // 4, n - 2 * (n // 4)]  # three shards
    for consumed in (0, nodes * ranks * batch):
        if consumed and n < consumed + nodes * ranks * batch:
            continue
        plans = []
        for world in World.every_rank(nodes, ranks):
            plan = plan_rank(counts, 3, 0, world, batch, shuffle=True, pad="none",
                             samples_consumed=consumed)  # fmt: skip
            got = rank_samples(n, world.world_size, batch, canonical_nodes=nodes,
                               samples_consumed=consumed, pad="none", slot=world.slot)  # fmt: skip
            assert got == plan.size
            plans.append(plan)
        flat = np.concatenate(plans)
        assert flat.size == len(set(flat.tolist())) == n - consumed
