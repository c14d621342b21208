"""``TokenDataset``: windows against a reference packing, positions and boundaries,
exactly once over virtual worlds, resume through ``fastload.DataLoader``, and the
cache over SeaweedFS."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from text_helpers import converted_stream, doc_starts, reference_windows, write_jsonl

import fastload
from fastload import World
from fastload.errors import ConfigError
from fastload.text.tokens import TokenDataset, TokenLayout, collate_packed
from support.resume import resume_halves

EOS = 2


@pytest.fixture(scope="module")
def token_url(
    tmp_path_factory: pytest.TempPathFactory, corpus: list[str], tokenizer_path: str
) -> str:
    """The corpus as token shards of 1 KB (about 500 tokens each: many shards)."""
    root = tmp_path_factory.mktemp("tokens")
    write_jsonl(str(root / "src" / "a.jsonl"), corpus)
    fastload.convert.text(
        str(root / "src"), str(root / "out"), tokenizer=tokenizer_path, shard_size="1KB"
    )
    return str(root / "out")


@pytest.fixture(scope="module")
def stream(corpus: list[str], tokenizer_path: str) -> list[int]:
    return converted_stream(tokenizer_path, corpus, EOS)


def as_tuple(item: dict[str, torch.Tensor]) -> tuple[int, ...]:
    return tuple(item["input_ids"].tolist())


@pytest.mark.parametrize("seq_len", [1, 7, 64, 1500])
def test_windows_equal_the_reference_packing(
    token_url: str, stream: list[int], seq_len: int
) -> None:
    ds = TokenDataset(token_url, seq_len=seq_len, shuffle=False)
    ref = reference_windows(stream, seq_len)
    assert ds.num_windows == len(ref) == (len(stream) - 1) // seq_len
    assert ds.num_tokens == len(stream)
    picks = range(len(ref)) if len(ref) < 400 else [0, 1, 2, *range(3, len(ref), 13), len(ref) - 1]
    for k in picks:
        item = ds[k]
        assert item["input_ids"].dtype == torch.int64
        assert item["input_ids"].tolist() == ref[k][0]
        assert item["labels"].tolist() == ref[k][1]
    assert ds[-1]["input_ids"].tolist() == ref[-1][0]
    with pytest.raises(IndexError):
        ds[len(ref)]
    # windows of 1500 tokens span several 500-token shards
    if seq_len == 1500:
        assert len(ds.layout.pieces(0)) >= 3


def test_layout_counts_windows_per_starting_shard() -> None:
    layout = TokenLayout([10, 3, 0, 12], seq_len=4)
    assert layout.num_windows == (25 - 1) // 4
    # window starts 0,4,8 | 12 | - | 16,20
    assert layout.shard_windows.tolist() == [3, 1, 0, 2]
    assert layout.pieces(2) == [(0, 8, 10), (1, 0, 3)]
    assert layout.pieces(5) == [(3, 7, 12)]
    with pytest.raises(ConfigError):
        TokenLayout([10], seq_len=0)


def test_position_ids_and_cu_seqlens(
    token_url: str, stream: list[int], corpus: list[str], tokenizer_path: str
) -> None:
    L = 48
    ds = TokenDataset(token_url, seq_len=L, position_ids=True, cu_seqlens=True, shuffle=False)
    starts = doc_starts(tokenizer_path, corpus, EOS)
    for k in range(ds.num_windows):
        a = k * L
        t = np.arange(a, a + L)
        doc_start = starts[np.searchsorted(starts, t, side="right") - 1]
        want = t - np.maximum(doc_start, a)
        item = ds[k]
        assert item["position_ids"].tolist() == want.tolist()
        cu = item["cu_seqlens"]
        assert cu.dtype == torch.int32
        assert cu.tolist() == [*np.flatnonzero(want == 0).tolist(), L]
    batch = collate_packed([ds[3], ds[4]])
    assert batch["input_ids"].shape == (2, L)
    c3, c4 = ds[3]["cu_seqlens"], ds[4]["cu_seqlens"]
    assert batch["cu_seqlens"].tolist() == [*c3.tolist(), *(c4[1:] + L).tolist()]
    assert int(batch["max_seqlen"]) == int(max(np.diff(c3).max(), np.diff(c4).max()))


def test_an_image_dataset_is_refused(tmp_path: Path) -> None:
    with fastload.ShardWriter(str(tmp_path / "img")) as w:
        w.write({"__key__": "a", "jpg": b"x"})
    with pytest.raises(ConfigError, match="samples shards, not tokens"):
        TokenDataset(str(tmp_path / "img"), seq_len=8, shuffle=False)


def test_one_process_iterates_every_window_once(token_url: str, stream: list[int]) -> None:
    ds = TokenDataset(token_url, seq_len=16, shuffle=True, seed=3, world=World.single())
    got = [as_tuple(x) for x in ds]
    ref = [tuple(w[0]) for w in reference_windows(stream, 16)]
    assert len(ds) == len(ref)
    assert Counter(got) == Counter(ref)
    assert got != ref  # shuffled
    ordered = [
        as_tuple(x)
        for x in TokenDataset(token_url, seq_len=16, world=World.single(), shuffle=False)
    ]
    assert ordered == ref


@pytest.mark.parametrize("drop_last", [True, False])
def test_exactly_once_over_nodes_ranks_and_workers(
    token_url: str, stream: list[int], drop_last: bool
) -> None:
    L, batch = 16, 4
    ref = Counter(tuple(w[0]) for w in reference_windows(stream, L))
    seen: Counter[tuple[int, ...]] = Counter()
    per_rank = []
    for node in range(2):
        for local in range(2):
            rank_items = 0
            for worker in range(2):
                world = World(num_nodes=2, node=node, ranks_per_node=2, local_rank=local,
                              num_workers=2, worker=worker)  # fmt: skip
                ds = TokenDataset(token_url, seq_len=L, shuffle=True, seed=9, world=world)
                ds.configure(batch_size=batch, drop_last=drop_last, samples_consumed=0)
                items = [as_tuple(x) for x in ds]
                seen.update(items)
                rank_items += len(items)
            per_rank.append(rank_items)
    n = sum(ref.values())
    if drop_last:
        assert len(set(per_rank)) == 1  # equal counts: no rank waits for another
        assert not seen - ref  # nothing repeated or invented
        assert sum(seen.values()) == n // (4 * batch) * 4 * batch
    else:
        assert seen == ref  # everything once, nothing repeated
        assert max(per_rank) - min(per_rank) <= batch  # uneven ranks: the last get fewer


def _collate_ids(batch: list[dict[str, torch.Tensor]]) -> list[tuple[int, ...]]:
    return [as_tuple(x) for x in batch]


def test_resume_through_the_loader_with_workers(token_url: str) -> None:
    def loader() -> fastload.DataLoader:
        ds = TokenDataset(token_url, seq_len=32, shuffle=True, seed=4, world=World.single())
        return fastload.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=_collate_ids,
                                   world=World.single())  # fmt: skip

    full = [b for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    rest = list(second)
    assert head + rest == full
    assert len(full) == len(first)
    # the next epoch is a different order of the same windows (padded by other repeats)
    epoch1 = list(second)
    assert {x for b in epoch1 for x in b} == {x for b in full for x in b}
    assert epoch1 != full


def test_elastic_resume_onto_another_world(token_url: str, stream: list[int]) -> None:
    L = 16
    ref = Counter(tuple(w[0]) for w in reference_windows(stream, L))

    def loaders(world_size: int, batch: int) -> list[fastload.DataLoader]:
        out = []
        for r in range(world_size):
            world = World.of(rank=r, world_size=world_size)
            ds = TokenDataset(
                token_url, seq_len=L, shuffle=True, seed=5, world=world, drop_last=True
            )
            out.append(fastload.DataLoader(ds, batch_size=batch, world=world, drop_last=True,
                                           collate_fn=_collate_ids))  # fmt: skip
        return out

    two = loaders(2, 6)
    its = [iter(lo) for lo in two]
    before = [x for it in its for _ in range(7) for x in next(it)]
    state = two[0].state_dict()
    assert state == two[1].state_dict()
    three = loaders(3, 4)
    after = []
    for lo in three:
        lo.load_state_dict(state)
        after += [x for b in lo for x in b]
    total = sum(ref.values()) // 12 * 12
    assert len(before) == 7 * 12
    assert not (Counter(before) + Counter(after)) - ref  # no window twice
    assert len(before) + len(after) == total  # none lost


def test_state_from_another_window_length_is_refused(token_url: str) -> None:
    a = fastload.DataLoader(TokenDataset(token_url, seq_len=16, world=World.single(),
                                         shuffle=False),
                            batch_size=2, world=World.single())  # fmt: skip
    b = fastload.DataLoader(TokenDataset(token_url, seq_len=32, world=World.single(),
                                         shuffle=False),
                            batch_size=2, world=World.single())  # fmt: skip
    with pytest.raises(ConfigError):
        b.load_state_dict(a.state_dict())


def test_token_shards_through_the_cache_from_s3(
    seaweed: Any, tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    url = seaweed.new_url("tok")
    opts = seaweed.storage_options
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:150])
    fastload.convert.text(str(tmp_path / "a.jsonl"), url, tokenizer=tokenizer_path,
                          shard_size="2KB", storage_options=opts)  # fmt: skip
    ref = reference_windows(converted_stream(tokenizer_path, corpus[:150], EOS), 24)
    cache = tmp_path / "cache"
    ds = TokenDataset(
        url, seq_len=24, cache_dir=cache, storage_options=opts, world=World.single(), shuffle=False
    )
    assert [as_tuple(x) for x in ds] == [tuple(w[0]) for w in ref]
    first = ds.io_stats()
    assert first["remote_bytes"] >= ds.manifest.total_bytes
    assert first["disk_bytes"] > 0
    ds.close()
    again = TokenDataset(
        url, seq_len=24, cache_dir=cache, storage_options=opts, world=World.single(), shuffle=False
    )
    assert [as_tuple(x) for x in again] == [tuple(w[0]) for w in ref]
    assert again.io_stats()["remote_bytes"] == 0  # the node cache serves the second reader
    again.close()


def test_a_dataset_shorter_than_one_window(tmp_path: Path, tokenizer_path: str) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), ["a b"])
    fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tokenizer_path
    )
    # not an empty loader without a word: a clear error naming the corpus size
    with pytest.raises(ConfigError, match=r"seq_len=64 is longer than the corpus \(\d+ tokens\)"):
        TokenDataset(str(tmp_path / "out"), seq_len=64, world=World.single(), shuffle=False)


def test_fastload_bench_measures_tokens(
    token_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fastload.cli import main
    from fastload.cli.bench_tokens import bench_seq_len

    out = tmp_path / "bench.json"
    assert main(["bench", token_url, "--workers", "0", "--batch-size", "4", "--epochs", "1",
                 "--json", str(out), "--quiet"]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["kind"] == "tokens"
    ds = TokenDataset(token_url, seq_len=doc["seq_len"], shuffle=False)
    assert doc["seq_len"] == bench_seq_len(ds.num_tokens, 4)
    assert doc["tokens_per_epoch"] == ds.num_windows // 4 * 4 * doc["seq_len"]
    # the cold epoch fetched the shards it read (the dropped last batch's tail excepted)
    m = ds.manifest
    assert 0.8 * m.total_bytes <= doc["cold"]["remote_bytes"]
    assert (
        doc["cold"]["remote_bytes"] <= m.total_bytes + sum(s.index_bytes for s in m.shards) + 4096
    )
    assert "warm epoch" in capsys.readouterr().out


def test_fastload_demo_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastload.cli import main

    keep = tmp_path / "demo"
    rc = main(["demo", "--text", "--images", "30", "--file-store", "--keep", str(keep),
               "--workers", "0", "--batch-size", "2", "--epochs", "1", "--quiet"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "warm epoch" in out
    assert "300 documents" in out
    m = fastload.Manifest.load((keep / "store" / "text" / "tokens").as_uri())
    assert m.kind == "tokens"
    assert m.source["documents"] + m.source["empty_documents"] == 300


def test_state_dict_round_trips(token_url: str) -> None:
    import json

    ds = TokenDataset(token_url, seq_len=16, shuffle=True, seed=4, world=World.single())
    it = iter(ds)
    first = [as_tuple(next(it)) for _ in range(10)]
    state = ds.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["yielded"] == 10
    again = TokenDataset(token_url, seq_len=16, shuffle=True, seed=0, world=World.single())
    again.load_state_dict(state)
    assert again.seed == 4
    rest = [as_tuple(x) for x in again]
    whole = [as_tuple(x) for x in TokenDataset(token_url, seq_len=16, shuffle=True, seed=4,
                                                world=World.single())]  # fmt: skip
    assert first + rest == whole
    with pytest.raises(ConfigError, match="not a TokenDataset state"):
        again.load_state_dict({"kind": "fastload.streaming", "version": 1})
    with pytest.raises(ConfigError, match="num_samples=\\d+; this TokenDataset"):
        TokenDataset(token_url, seq_len=8, shuffle=True).load_state_dict(state)  # other windows


def _ids_list(batch: list[dict[str, torch.Tensor]]) -> list[tuple[int, ...]]:
    return [as_tuple(x) for x in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly(token_url: str, workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> Any:
        ds = TokenDataset(token_url, seq_len=16, shuffle=True, seed=3, world=World.single())
        return StatefulDataLoader(ds, batch_size=8, num_workers=workers, collate_fn=_ids_list)

    full, head, rest = resume_halves(make, 9)
    assert Counter(x for b in full for x in b) == Counter(
        as_tuple(x)
        for x in TokenDataset(token_url, seq_len=16, world=World.single(), shuffle=False)
    )
    assert head + rest == full
