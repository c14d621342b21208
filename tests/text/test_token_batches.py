"""``fastload.DataLoader`` over a ``TokenDataset`` with the default collate builds
whole batches in its own process (``fastload.loader.token_batches``): no worker
process, and exactly the batches of torch's path (``transport="pickle"``), byte for
byte, in order, on resume and over ranks."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from text_helpers import converted_stream, reference_windows, write_jsonl

import fastload
from fastload import World
from fastload.errors import ConfigError
from fastload.text.tokens import TokenDataset, collate_packed
from support.resume import elastic_resume_in_epoch_1

EOS = 2


@pytest.fixture(scope="module")
def token_url(
    tmp_path_factory: pytest.TempPathFactory, corpus: list[str], tokenizer_path: str
) -> str:
    """The corpus as token shards of 1 KB (about 500 tokens each: many shards, and
    windows longer than a shard cross several)."""
    root = tmp_path_factory.mktemp("tokens")
    write_jsonl(str(root / "src" / "a.jsonl"), corpus)
    fastload.convert.text(
        str(root / "src"), str(root / "out"), tokenizer=tokenizer_path, shard_size="1KB"
    )
    return str(root / "out")


def _loader(url: str, seq_len: int, *, shuffle: bool, workers: int, world: World | None = None,
            batch: int = 8, drop_last: bool = False, extras: bool = False,
            **kwargs: Any) -> fastload.DataLoader:  # fmt: skip
    world = world or World.single()
    ds = TokenDataset(url, seq_len=seq_len, shuffle=shuffle, seed=7, world=world,
                      position_ids=extras, cu_seqlens=extras)  # fmt: skip
    return fastload.DataLoader(ds, batch_size=batch, num_workers=workers, world=world,
                               drop_last=drop_last, **kwargs)  # fmt: skip


def _elastic_loaders(
    token_url: str, worlds: list[World], seq_len: int, batch: int, transport: str
) -> list[fastload.DataLoader]:
    """Shuffled, in-process loaders for the elastic-resume tests, one per world."""
    return [_loader(token_url, seq_len, shuffle=True, workers=0, world=w, batch=batch,
                    drop_last=True, transport=transport) for w in worlds]  # fmt: skip


class _Windows:
    """The unshuffled dataset's windows: ``count``, and called on batches, the index of
    the window each of their rows is."""

    def __init__(self, token_url: str, seq_len: int) -> None:
        ds = TokenDataset(token_url, seq_len=seq_len, world=World.single(), shuffle=False)
        self.count = ds.num_windows
        self._index = {tuple(ds[k]["input_ids"].tolist()): k for k in range(ds.num_windows)}

    def __call__(self, batches: list[dict[str, Any]]) -> list[int]:
        return [self._index[tuple(r)] for b in batches for r in b["input_ids"].tolist()]


def assert_same_batches(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        for key in a:
            x, y = a[key], b[key]
            if not isinstance(x, torch.Tensor):  # max_seqlen: a Python int on both paths
                assert type(x) is type(y) is int, key
                assert x == y, key
                continue
            assert x.dtype == y.dtype, key
            assert x.shape == y.shape, key
            assert x.is_contiguous(), key
            assert x.numpy().tobytes() == y.contiguous().numpy().tobytes(), key


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_equal_the_pickle_path(token_url: str, shuffle: bool, workers: int) -> None:
    fast = _loader(token_url, 32, shuffle=shuffle, workers=workers)
    slow = _loader(token_url, 32, shuffle=shuffle, workers=workers, transport="pickle")
    assert (fast.transport, fast.worker_processes) == ("cache", 0)
    assert (slow.transport, slow.worker_processes) == ("pickle", workers)
    got, want = list(fast), list(slow)
    assert_same_batches(got, want)
    assert len(got) == len(fast)
    assert got[0]["input_ids"].shape == (8, 32)
    assert got[0]["input_ids"].dtype == torch.int64
    assert fast._tokens is not None
    assert fast._tokens.batches == len(got)
    # the same bytes served out of the cache, counted as the dataset's own reads
    assert fast.io_stats()["ram_bytes"] == slow.io_stats()["ram_bytes"] > 0


@pytest.mark.parametrize("seq_len", [100, 1500])
def test_windows_across_shards_with_positions_and_cu_seqlens(token_url: str, seq_len: int) -> None:
    fast = _loader(token_url, seq_len, shuffle=True, workers=2, batch=3, extras=True)
    # torch's default collate cannot batch cu_seqlens: the pickle path needs collate_packed
    slow = _loader(token_url, seq_len, shuffle=True, workers=0, batch=3, extras=True,
                   transport="pickle", collate_fn=collate_packed)  # fmt: skip
    got, want = list(fast), list(slow)
    assert_same_batches(got, want)
    assert list(got[0]) == ["input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen"]
    assert fast._tokens is not None
    assert fast._tokens.crossing > 0  # some windows crossed a shard boundary
    # collate_packed given explicitly takes the same path
    explicit = _loader(token_url, seq_len, shuffle=True, workers=0, batch=3, extras=True,
                       collate_fn=collate_packed)  # fmt: skip
    assert explicit.transport == "cache"
    assert_same_batches(list(explicit), want)


def test_windows_equal_the_reference_packing(
    token_url: str, corpus: list[str], tokenizer_path: str
) -> None:
    ref = reference_windows(converted_stream(tokenizer_path, corpus, EOS), 64)
    loader = _loader(token_url, 64, shuffle=False, workers=0, batch=5, drop_last=True)
    batches = list(loader)
    n = len(ref) // 5 * 5
    assert [row for b in batches for row in b["input_ids"].tolist()] == [w[0] for w in ref[:n]]
    assert [row for b in batches for row in b["labels"].tolist()] == [w[1] for w in ref[:n]]


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_equals_the_uninterrupted_epoch(token_url: str, workers: int) -> None:
    full = list(_loader(token_url, 32, shuffle=True, workers=workers))
    first = _loader(token_url, 32, shuffle=True, workers=workers)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    assert state["batches_consumed"] == 5
    del it
    second = _loader(token_url, 32, shuffle=True, workers=workers)
    second.load_state_dict(state)
    rest = list(second)
    assert_same_batches(head + rest, full)
    # the next epoch: the pickle path's next epoch, too
    slow = _loader(token_url, 32, shuffle=True, workers=0, transport="pickle")
    slow.set_epoch(1)
    assert second.epoch == 1
    assert_same_batches(list(second), list(slow))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_world_split_covers_every_window_once(token_url: str, drop_last: bool) -> None:
    L, batch, ranks = 32, 4, 3
    ds = TokenDataset(token_url, seq_len=L, world=World.single(), shuffle=False)
    index = {tuple(ds[k]["input_ids"].tolist()): k for k in range(ds.num_windows)}
    assert len(index) == ds.num_windows  # windows identify themselves by content
    seen: Counter[int] = Counter()
    per_rank = []
    for rank in range(ranks):
        world = World.of(rank=rank, world_size=ranks)
        loader = _loader(token_url, L, shuffle=True, workers=2, world=world, batch=batch,
                         drop_last=drop_last)  # fmt: skip
        want = list(_loader(token_url, L, shuffle=True, workers=0, world=world, batch=batch,
                            drop_last=drop_last, transport="pickle"))  # fmt: skip
        got = list(loader)
        assert_same_batches(got, want)
        ks = [index[tuple(row)] for b in got for row in b["input_ids"].tolist()]
        per_rank.append(len(ks))
        seen.update(ks)
    n, g = ds.num_windows, ranks * batch
    assert max(seen.values()) == 1  # no window repeated, with drop_last or without
    if drop_last:
        assert len(set(per_rank)) == 1  # equal counts: no rank waits for another
        assert sum(seen.values()) == n // g * g
    else:
        # every window once; the epoch's last, short step leaves the last ranks shorter
        assert set(seen) == set(range(n))
        assert sum(per_rank) == n
        assert max(per_rank) - min(per_rank) <= batch


def test_batch_buffers_are_recycled_and_kept_batches_stay_valid(token_url: str) -> None:
    loader = _loader(token_url, 32, shuffle=True, workers=0)
    kept = []
    for k, batch in enumerate(loader):
        if k % 10 == 0:
            kept.append((batch, batch["input_ids"].clone(), batch["labels"].clone()))
        del batch
    assert loader._tokens is not None
    assert loader._tokens.slabs.stats().reuses > 0  # dropped batches gave their buffer back
    for batch, ids, labels in kept:  # a kept batch was never written over
        assert torch.equal(batch["input_ids"], ids)
        assert torch.equal(batch["labels"], labels)
        assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


def test_a_custom_collate_keeps_torchs_path(token_url: str) -> None:
    def ids(items: list[dict[str, torch.Tensor]]) -> np.ndarray:
        return np.stack([x["input_ids"].numpy() for x in items])

    loader = _loader(token_url, 32, shuffle=False, workers=2, collate_fn=ids)
    assert (loader.transport, loader.worker_processes) == ("pickle", 2)
    assert isinstance(next(iter(loader)), np.ndarray)
    with pytest.raises(ConfigError, match="transport='pickle'"):
        _loader(token_url, 32, shuffle=False, workers=0, collate_fn=ids, transport="cache")


def test_plan_in_workers_keeps_worker_processes(token_url: str) -> None:
    loader = _loader(token_url, 32, shuffle=True, workers=2, plan_in_workers=True)
    assert (loader.transport, loader.worker_processes) == ("pickle", 2)
    want = list(_loader(token_url, 32, shuffle=True, workers=0))
    assert_same_batches(list(loader), want)


def _index_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fastload-index")]


def test_closing_the_loader_ends_an_abandoned_iteration_and_its_prefetch(
    token_url: str,
) -> None:
    before = set(_index_threads())  # other tests' loaders may have left theirs
    loader = _loader(token_url, 32, shuffle=True, workers=0)
    tokens = loader._tokens
    assert tokens is not None
    it = iter(loader)
    first = next(it)
    assert first["input_ids"].shape == (8, 32)
    assert tokens._running is not None
    assert set(_index_threads()) - before  # the plan's shards are staged ahead
    loader.close()
    assert tokens._running is None
    assert set(_index_threads()) - before == set()
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("transport", ["auto", "pickle"])
def test_a_later_epoch_after_an_elastic_resume_uses_its_own_layout(
    token_url: str, transport: str
) -> None:
    # 2 nodes x 1 rank save mid-epoch 0; 1 node x 2 ranks (same global batch) finish it
    # and break mid-epoch 1: epoch 1 started on 1 node, so its state, its resume and a
    # re-iteration must use that layout, not the loaded one of epoch 0
    L, batch = 32, 4

    def loaders(worlds: list[World]) -> list[fastload.DataLoader]:
        return _elastic_loaders(token_url, worlds, L, batch, transport)

    two_nodes = loaders(World.every_rank(2, 1))
    for lo in two_nodes:
        it = iter(lo)
        for _ in range(3):
            next(it)
        del it
    state = two_nodes[0].state_dict()
    assert state["dataset"]["canonical_nodes"] == 2
    one_node = loaders(World.every_rank(1, 2))
    for lo in one_node:
        lo.load_state_dict(state)
        list(lo)  # the rest of epoch 0
        assert lo.epoch == 1
    windows = _Windows(token_url, L)

    epoch1: list[int] = []
    for lo in one_node:
        it = iter(lo)
        epoch1 += windows([next(it) for _ in range(2)])
        del it
    mid = one_node[0].state_dict()
    assert mid["dataset"]["canonical_nodes"] == 1  # the layout epoch 1 started with
    for lo in one_node:  # a re-iteration continues epoch 1 where it stopped
        epoch1 += windows(list(lo))
    n, g = windows.count, 2 * batch
    assert len(epoch1) == n // g * g
    assert len(set(epoch1)) == len(epoch1)  # no window twice, none lost


@pytest.mark.parametrize("transport", ["auto", "pickle"])
def test_an_elastic_resume_in_a_later_epoch_keeps_the_saved_layout(
    token_url: str, transport: str
) -> None:
    # saved mid-epoch 1 on 2 nodes, loaded into fresh loaders (epoch 0) on 1 node
    L, batch = 32, 4
    windows = _Windows(token_url, L)
    before, after, state = elastic_resume_in_epoch_1(
        lambda worlds: _elastic_loaders(token_url, worlds, L, batch, transport), windows
    )
    assert (state["epoch"], state["dataset"]["canonical_nodes"]) == (1, 2)
    n, g = windows.count, 2 * batch
    assert len(before) + len(after) == n // g * g
    assert len(set(before + after)) == len(before) + len(after)  # none twice, none lost
