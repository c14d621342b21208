"""``fastload.DataLoader`` over ``ParquetTokenDataset(stream=True)``: batches while
the first pass still tokenizes (:meth:`ParquetTokenDataset.stream_steps`,
:mod:`fastload.loader.token_batches`). The parquet files are on SeaweedFS; a real
process holds the lock of the last piece of row groups (as a local rank tokenizing
it would), so the first pass provably cannot finish while the loader already yields
batches: counters and contents, never timing. The batches, their order, resume and
``len()`` equal the finished dataset's loader's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import tokenizers
import torch
from test_parquet_stream import EOS, corpus_dir, held_piece

import fastload
from fastload import World
from fastload.storage import open_store
from fastload.text import ParquetTokenDataset, scan_parquet
from fastload.text.parquet_build import plan_pieces
from fastload.text.parquet_tokens import token_dir
from fastload.text.tokenizer import token_dtype, tokenizer_fingerprint

T = TypeVar("T")
BATCH = 4


def in_time(fn: Callable[[], T], what: str, limit: float = 120.0) -> T:
    """``fn()`` in a thread: a loader that waits for the whole first pass while the last
    piece is held would wait forever (the test then fails instead of hanging; the
    thread ends once the holder lets go)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"{what} waited for the whole first pass (its last piece is held)"
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class Corpus:
    """Parquet files of many small row groups on SeaweedFS (about one piece per row
    group) and where their first pass keeps its pieces in a node cache."""

    def __init__(self, seaweed: Any, tmp: Path, tokenizer_path: str, seed: int) -> None:
        root, _ = corpus_dir(tmp / "pq", seed=seed)
        self.url, self.opts = seaweed.new_url("pq"), seaweed.storage_options
        store = open_store(self.url, self.opts)
        for p in sorted(root.iterdir()):
            store.write_bytes(p.name, p.read_bytes())
        self.tmp, self.tokenizer_path = tmp, tokenizer_path
        self.files = scan_parquet(self.url, self.opts)
        self.count = len(plan_pieces(self.files))

    def pieces_dir(self, cache: Path) -> Path:
        tok = tokenizers.Tokenizer.from_file(self.tokenizer_path)
        dtype = token_dtype("auto", tok.get_vocab_size(with_added_tokens=True))
        d = token_dir(cache, self.files, tokenizer_fingerprint(tok), "text", EOS, dtype)
        return d.parent / f".{d.name}.pieces"

    def held(self, cache: Path) -> Any:
        """The last piece of the first pass into ``cache``, held by another process."""
        return held_piece(self.pieces_dir(cache), self.count - 1)

    def last_piece_published(self, cache: Path) -> bool:
        return (self.pieces_dir(cache) / f"{self.count - 1:06d}.npz").exists()

    def dataset(self, cache: Path, **kw: Any) -> ParquetTokenDataset:
        kw.setdefault("world", World.single())
        kw.setdefault("shuffle", False)
        return ParquetTokenDataset(self.url, tokenizer=self.tokenizer_path, seq_len=16,
                                   cache_dir=cache, storage_options=self.opts, threads=2,
                                   **kw)  # fmt: skip

    def loader(self, cache: Path, workers: int = 0, **kw: Any) -> fastload.DataLoader:
        return fastload.DataLoader(self.dataset(cache, **kw), batch_size=BATCH,
                                   num_workers=workers)  # fmt: skip


def same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Batch by batch: the same fields, in the same order, equal tensors and dtypes."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype, key
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize(("labels", "workers"), [("shifted", 0), ("shifted", 2), ("hf", 0),
                                                 ("hf", 2)])  # fmt: skip
def test_loader_yields_batches_before_the_first_pass_ends(
    seaweed: Any, tmp_path: Path, tokenizer_path: str, labels: str, workers: int
) -> None:
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=31)
    cache = tmp_path / "cache"
    assert corpus.count > 20
    kw: dict[str, Any] = {"position_ids": True, "cu_seqlens": True}
    if labels == "hf":
        kw["labels"] = "hf"
    with corpus.held(cache):

        def start() -> tuple[Any, Any, list[dict[str, Any]]]:
            loader = corpus.loader(cache, workers, stream=True, **kw)
            it = iter(loader)
            return loader, it, [next(it) for _ in range(6)]

        loader, it, got = in_time(start, "fastload.DataLoader")
        ds = loader.dataset
        assert loader.transport_plan.batches == "tokens"
        assert loader.worker_processes == 0
        assert "served as its pieces are tokenized" in loader.transport_plan.why
        assert ds.first_pass_running()
        assert ds.pieces_at_first_window is not None
        assert 1 <= ds.pieces_at_first_window < corpus.count  # the first batch came early
        assert not corpus.last_piece_published(cache)
        assert not (ds.token_dir / "manifest.json").exists()
        with pytest.raises(TypeError, match="not known while its first pass tokenizes"):
            len(loader)
    if workers:
        # the first pass ends (the holder died: it takes the piece over) and deletes the
        # pieces: the loader goes on from the token shards where the pieces left off
        while ds.first_pass_running():
            time.sleep(0.01)
        assert not corpus.pieces_dir(cache).exists()
    got += list(it)  # else the pieces still published, then the finished plan's tail
    assert not ds.first_pass_running()
    finished = corpus.loader(cache, workers, **kw)
    assert not finished.dataset.tokenized_here
    want = list(finished)
    same(got, want)  # every window once, in the finished loader's batches
    assert len(loader) == len(finished) == len(want)
    assert loader.epoch == 1  # the epoch ended with the last batch, as the finished one's
    assert [b["input_ids"].shape[0] for b in got[:-1]] == [BATCH] * (len(got) - 1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_of_a_node_stream_their_slots_of_the_finished_plan(
    seaweed: Any, tmp_path: Path, tokenizer_path: str, drop_last: bool
) -> None:
    # two local ranks (two datasets of this process, sharing the first pass), batch 3
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=37)
    cache = tmp_path / "cache"
    worlds = [World(ranks_per_node=2, local_rank=r, rank=r, world_size=2) for r in range(2)]

    def loader(world: World, **kw: Any) -> fastload.DataLoader:
        return fastload.DataLoader(corpus.dataset(cache, world=world, **kw), batch_size=3,
                                   drop_last=drop_last, world=world)  # fmt: skip

    with corpus.held(cache):

        def start() -> list[tuple[Any, list[dict[str, Any]]]]:
            out = []
            for world in worlds:
                it = iter(loader(world, stream=True))
                out.append((it, [next(it) for _ in range(4)]))
            return out

        started = in_time(start, "fastload.DataLoader")
        assert not corpus.last_piece_published(cache)
    for (it, head), world in zip(started, worlds, strict=True):
        want = list(loader(world))  # the finished dataset's plan of this rank
        same(head + list(it), want)


def test_resume_mid_first_pass_onto_a_stream_and_onto_the_finished_dataset(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=32)
    cache = tmp_path / "cache"
    want = list(corpus.loader(tmp_path / "ref"))
    with corpus.held(cache):

        def first_part() -> tuple[list[Any], dict[str, Any], list[Any], Any, dict[str, Any]]:
            loader = corpus.loader(cache, stream=True)
            it = iter(loader)
            head = [next(it) for _ in range(5)]
            state = json.loads(json.dumps(loader.state_dict()))
            # resumed while the first pass still runs (a second dataset of the process)
            again = corpus.loader(cache, stream=True)
            again.load_state_dict(state)
            it2 = iter(again)
            middle = [next(it2) for _ in range(3)]
            return head, state, middle, it2, json.loads(json.dumps(again.state_dict()))

        head, state, middle, it2, state2 = in_time(first_part, "fastload.DataLoader")
        assert state["batches_consumed"] == 5
        assert state2["batches_consumed"] == 8
        assert "num_samples" not in state["dataset"]  # not known yet
        assert not corpus.last_piece_published(cache)
    rest2 = list(it2)
    same(head + middle + rest2, want)
    # the states saved mid-first-pass, resumed on the finished dataset
    for saved, before in ((state, head), (state2, head + middle)):
        done = corpus.loader(cache)
        done.load_state_dict(saved)
        same(before + list(done), want)


def test_a_finished_loader_state_resumes_on_a_stream(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=33)
    ref = corpus.loader(tmp_path / "ref")
    want = list(ref)
    it = iter(ref)  # the next epoch, identical (unshuffled)
    head = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(ref.state_dict()))
    assert state["dataset"]["num_samples"] > 0
    cache = tmp_path / "cache"
    with corpus.held(cache):

        def resumed() -> tuple[Any, Any, list[Any]]:
            loader = corpus.loader(cache, stream=True)
            loader.load_state_dict(state)
            it = iter(loader)
            return loader, it, [next(it) for _ in range(3)]

        loader, it2, middle = in_time(resumed, "fastload.DataLoader")
        assert loader.dataset.first_pass_running()
        assert not corpus.last_piece_published(cache)
    same(head + middle + list(it2), want)


def test_a_shuffled_epoch_or_many_nodes_wait_for_the_first_pass_and_say_so(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=34)
    want = list(corpus.loader(tmp_path / "ref", shuffle=True, seed=3))
    cache = tmp_path / "cache"
    seen: dict[str, Any] = {}
    with corpus.held(cache):
        # the loader is made at once (nothing of the token shards opened yet)
        loader = in_time(lambda: corpus.loader(cache, stream=True, shuffle=True, seed=3),
                         "a loader over a shuffled stream")  # fmt: skip
        assert "a shuffled epoch needs the window count" in loader.transport_plan.why
        assert loader.dataset.first_pass_running()
        two_nodes = World(num_nodes=2, ranks_per_node=1, rank=0, world_size=2)
        many = in_time(lambda: corpus.loader(tmp_path / "c2", stream=True, world=two_nodes),
                       "a loader over a two-node stream")  # fmt: skip
        assert "a multi-node world needs the window count" in many.transport_plan.why
        assert not many.dataset.streams()

        def first() -> None:
            batch = next(iter(loader))
            # what the first batch found: the first pass over, every piece tokenized
            seen["running"] = loader.dataset.first_pass_running()
            seen["manifest"] = (loader.dataset.token_dir / "manifest.json").exists()
            seen["batch"] = batch

        waiting = threading.Thread(target=first, daemon=True)
        waiting.start()
    waiting.join(300)
    assert seen["running"] is False
    assert seen["manifest"] is True
    rest = list(loader)
    same([seen["batch"], *rest], want)
    assert len(loader) == len(want)


def test_io_stats_while_streaming_count_the_pieces_read(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=35)
    cache = tmp_path / "cache"
    with corpus.held(cache):

        def start() -> tuple[Any, dict[str, float], dict[str, float]]:
            loader = corpus.loader(cache, stream=True)
            before = loader.io_stats()
            it = iter(loader)
            for _ in range(5):
                next(it)
            return loader, before, loader.io_stats()

        loader, before, during = in_time(start, "fastload.DataLoader")
        assert loader.dataset.first_pass_running()
    # 5 batches of 4 windows of 17 uint16 tokens (16 and the shifted label's last)
    assert before["disk_bytes"] == 0
    assert during["disk_bytes"] == 5 * BATCH * 17 * 2
    assert during["remote_bytes"] == 0  # the parquet files are read by the first pass
    finished = corpus.dataset(cache)
    assert set(during) == set(finished.io_stats())  # the same counters, zeros or real
    assert loader.stats().batches == 5
    list(loader)  # the rest, from the pieces and then the token shards
    assert loader.io_stats()["disk_bytes"] > during["disk_bytes"]


def test_hf_labels_stream_the_finished_items(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    # iterating the dataset itself (no loader): the same items as the finished one's
    corpus = Corpus(seaweed, tmp_path, tokenizer_path, seed=36)
    kw = {"labels": "hf", "position_ids": True, "cu_seqlens": True}
    cache = tmp_path / "cache"
    with corpus.held(cache):
        ds = corpus.dataset(cache, stream=True, **kw)
        it = iter(ds)
        got = in_time(lambda: [next(it) for _ in range(20)], "iterating the stream")
        assert ds.first_pass_running()
    got += list(it)
    want = list(corpus.dataset(cache, **kw))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b) == ["input_ids", "labels", "attention_mask", "position_ids",
                                      "cu_seqlens"]  # fmt: skip
        for key in a:
            assert a[key].dtype == b[key].dtype, key
            assert torch.equal(a[key], b[key]), key
    with pytest.raises(fastload.ConfigError, match="labels must be one of"):
        corpus.dataset(tmp_path / "c2", labels="shifted-by-two")
