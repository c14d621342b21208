"""``ParquetTokenDataset(..., stream=True)``: the first epoch served while the first
pass still tokenizes (:mod:`fastload.text.parquet_stream`). A real process holds the
lock of the last piece of row groups (as a local rank tokenizing it would), so the
first windows are provably served before the corpus is tokenized; counters, never
timing. The windows, their order, the rank split and resume equal the finished
dataset's."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers
from text_helpers import converted_stream, make_corpus, reference_windows, write_parquet

import fastload
from fastload import World
from fastload.text import ParquetTokenDataset, scan_parquet
from fastload.text.parquet_build import plan_pieces
from fastload.text.parquet_tokens import token_dir
from fastload.text.tokenizer import token_dtype, tokenizer_fingerprint

EOS = 2
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "TOKENIZERS_PARALLELISM": "false"}

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def corpus_dir(root: Path, docs: int = 1200, seed: int = 21) -> tuple[Path, list[str]]:
    """Parquet files of many small row groups: about one piece per row group."""
    corpus = make_corpus(docs, seed=seed)
    root.mkdir(parents=True)
    step = -(-len(corpus) // 4)
    for k in range(4):
        write_parquet(str(root / f"part-{k:03d}.parquet"), corpus[k * step : (k + 1) * step],
                      row_group_size=20)  # fmt: skip
    return root, corpus


def pieces_of(root: Path, cache: Path, tokenizer_path: str) -> tuple[Path, int]:
    """The pieces directory the first pass will use, and its piece count."""
    files = scan_parquet(str(root))
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    dtype = token_dtype("auto", tok.get_vocab_size(with_added_tokens=True))
    d = token_dir(cache, files, tokenizer_fingerprint(tok), "text", EOS, dtype)
    return d.parent / f".{d.name}.pieces", len(plan_pieces(files))


def last_piece(root: Path, cache: Path, tokenizer_path: str) -> tuple[Path, int]:
    pieces_dir, count = pieces_of(root, cache, tokenizer_path)
    return pieces_dir, count - 1


@contextlib.contextmanager
def held_piece(pieces_dir: Path, i: int) -> Iterator[None]:
    """Another process holds piece ``i``'s lock until the block ends (then exits
    without publishing it: the first pass takes it over)."""
    pieces_dir.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(pieces_dir / f"{i:06d}.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def ids(items: list[dict[str, Any]], key: str = "input_ids") -> list[tuple[int, ...]]:
    return [tuple(x[key].tolist()) for x in items]


def dataset(root: Path, cache: Path, tokenizer_path: str, **kw: Any) -> ParquetTokenDataset:
    kw.setdefault("world", World.single())
    return ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=16,
                               cache_dir=cache, shuffle=False, threads=2, **kw)  # fmt: skip


def test_first_windows_come_before_the_last_piece_is_tokenized(
    tmp_path: Path, tokenizer_path: str
) -> None:
    root, corpus = corpus_dir(tmp_path / "pq")
    cache = tmp_path / "cache"
    pieces_dir, count = pieces_of(root, cache, tokenizer_path)
    assert count > 20
    with held_piece(pieces_dir, count - 1):
        ds = dataset(root, cache, tokenizer_path, stream=True, position_ids=True,
                     cu_seqlens=True)  # fmt: skip
        it = iter(ds)
        got = [next(it) for _ in range(40)]
        assert ds.first_pass_running()
        assert ds.pieces_at_first_window is not None
        assert 1 <= ds.pieces_at_first_window < count  # the first window came early
        assert not (pieces_dir / f"{count - 1:06d}.npz").exists()
        assert not (ds.token_dir / "manifest.json").exists()
    got += list(it)  # the holder died: the first pass takes its piece over and ends
    assert not ds.first_pass_running()
    ref = reference_windows(converted_stream(tokenizer_path, corpus, EOS), 16)
    assert ids(got) == [tuple(w[0]) for w in ref]  # every window once, in order
    assert ids(got, "labels") == [tuple(w[1]) for w in ref]
    finished = dataset(root, cache, tokenizer_path, position_ids=True, cu_seqlens=True)
    assert not finished.tokenized_here
    want = list(finished)
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        assert ids(got, key) == ids(want, key)
    assert len(ds) == len(got)  # the finished dataset behind the streamed one


def test_stream_resumes_mid_first_epoch_exactly(tmp_path: Path, tokenizer_path: str) -> None:
    root, _ = corpus_dir(tmp_path / "pq", seed=22)
    cache = tmp_path / "cache"
    pieces_dir, count = pieces_of(root, cache, tokenizer_path)
    ref = list(dataset(root, tmp_path / "ref", tokenizer_path))
    with held_piece(pieces_dir, count - 1):
        ds = dataset(root, cache, tokenizer_path, stream=True)
        it = iter(ds)
        head = [next(it) for _ in range(25)]
        state = ds.state_dict()
        assert ds.first_pass_running()
        assert "num_samples" not in state  # not known yet
        # resumed while the first pass still runs (in a second dataset of the process)
        again = dataset(root, cache, tokenizer_path, stream=True)
        again.load_state_dict(state)
        it2 = iter(again)
        middle = [next(it2) for _ in range(10)]
        state2 = again.state_dict()
    rest2 = list(it2)
    assert ids(head + middle + rest2) == ids(ref)
    # the same state resumed on the finished dataset, and a finished state on a stream
    done = dataset(root, cache, tokenizer_path)
    done.load_state_dict(state2)
    assert ids(head + middle + list(done)) == ids(ref)


RANK = """
import json, sys
from fastload import World
from fastload.text import ParquetTokenDataset
r = int(sys.argv[4])
ds = ParquetTokenDataset(sys.argv[1], tokenizer=sys.argv[2], seq_len=16, cache_dir=sys.argv[3],
                         shuffle=False, threads=1, stream=True,
                         world=World(ranks_per_node=2, local_rank=r, rank=r, world_size=2))
ds.configure(batch_size=3, drop_last=False, samples_consumed=0)
out = []
for w in ds:
    out.append(w["input_ids"].tolist())
    if len(out) == 1:  # told while the last piece is still held by the test's holder
        print(json.dumps({"first": ds.pieces_at_first_window}), flush=True)
print(json.dumps({"windows": out}))
"""


def test_two_ranks_stream_disjoint_halves_of_the_finished_plan(
    tmp_path: Path, tokenizer_path: str
) -> None:
    root, _ = corpus_dir(tmp_path / "pq", seed=23)
    cache = tmp_path / "cache"
    pieces_dir, count = pieces_of(root, cache, tokenizer_path)
    with held_piece(pieces_dir, count - 1):
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(root), tokenizer_path,
                                   str(cache), str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=ENV, text=True)
                 for r in range(2)]  # fmt: skip
        # both ranks serve their first window while the last piece is held
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line, p.communicate()[1][-3000:]
            assert 1 <= json.loads(line)["first"] < count
            assert not (pieces_dir / f"{count - 1:06d}.npz").exists()
    results: list[dict[str, Any]] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    full = []
    for r in range(2):
        world = World(ranks_per_node=2, local_rank=r, rank=r, world_size=2)
        ds = dataset(root, cache, tokenizer_path, world=world)
        ds.configure(batch_size=3, drop_last=False, samples_consumed=0)
        want = [w["input_ids"].tolist() for w in ds]
        assert results[r]["windows"] == want  # the finished plan of this rank
        full += want
    # together the two ranks served every window exactly once (as a multiset: the
    # generated corpus repeats some windows' contents)
    assert sorted(map(tuple, full)) == sorted(ids(list(dataset(root, cache, tokenizer_path))))


def test_shuffled_or_dataloader_waits_and_serves_the_finished_order(
    tmp_path: Path, tokenizer_path: str
) -> None:
    root, _ = corpus_dir(tmp_path / "pq", docs=400, seed=24)
    kw: dict[str, Any] = {"tokenizer": tokenizer_path, "seq_len": 16, "world": World.single()}
    ref = ParquetTokenDataset(str(root), cache_dir=tmp_path / "ref", shuffle=True, seed=5, **kw)
    ds = ParquetTokenDataset(str(root), cache_dir=tmp_path / "c1", shuffle=True, seed=5,
                             stream=True, **kw)  # fmt: skip
    assert ids(list(ds)) == ids(list(ref))
    # a copy made while the first pass runs (as a spawned worker gets) joins the build
    with held_piece(*last_piece(root, tmp_path / "c3", tokenizer_path)):
        pending = ParquetTokenDataset(str(root), cache_dir=tmp_path / "c3", shuffle=False,
                                      stream=True, **kw)  # fmt: skip
        copy = pickle.loads(pickle.dumps(pending))
    assert ids(list(copy)) == ids(list(dataset(root, tmp_path / "ref", tokenizer_path)))
    assert ids(list(pending)) == ids(list(copy))
    loader_ref = fastload.DataLoader(dataset(root, tmp_path / "ref", tokenizer_path),
                                     batch_size=4, num_workers=2)  # fmt: skip
    streamed = dataset(root, tmp_path / "c2", tokenizer_path, stream=True)
    loader = fastload.DataLoader(streamed, batch_size=4, num_workers=2)
    want = [b["input_ids"] for b in loader_ref]
    it = iter(loader)
    head = [next(it)["input_ids"] for _ in range(3)]
    state = loader.state_dict()
    resumed = fastload.DataLoader(dataset(root, tmp_path / "c2", tokenizer_path),
                                  batch_size=4, num_workers=2)  # fmt: skip
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(head) + len(rest) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, want, strict=True))


def test_stream_must_be_a_bool(tmp_path: Path, tokenizer_path: str) -> None:
    root, _ = corpus_dir(tmp_path / "pq", docs=40)
    with pytest.raises(fastload.ConfigError, match="stream must be True or False"):
        dataset(root, tmp_path / "c", tokenizer_path, stream="yes")


def test_a_reader_before_the_first_piece_waits_rather_than_giving_up(tmp_path: Path) -> None:
    # the first pass makes the pieces' directory only once it starts: a reader that
    # comes first must keep waiting, not take the missing directory for a finished
    # dataset (which served the first window only after the whole first pass)
    from fastload.text.parquet_stream import PieceReader

    reader = PieceReader(tmp_path / ".k.pieces", 2, 4, tmp_path / "k" / "manifest.json")
    assert not reader.load_until(5)
    assert not reader.vanished
    (tmp_path / ".k.pieces").mkdir()
    np.savez(tmp_path / ".k.pieces" / "000000.npz", tokens=np.arange(6, dtype=np.uint16),
             lengths=np.array([2, 4]))  # fmt: skip
    assert reader.load_until(5)
    item = reader.item(0, position_ids=True, cu_seqlens=True)
    assert item["input_ids"].tolist() == [0, 1, 2, 3]
    assert item["labels"].tolist() == [1, 2, 3, 4]
    assert item["position_ids"].tolist() == [0, 1, 0, 1]
    assert item["cu_seqlens"].tolist() == [0, 2, 4]
    assert not reader.load_until(7)  # piece 1 not there yet
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text("{}")
    assert not reader.load_until(7)
    assert reader.vanished  # published: the finished dataset serves the rest
