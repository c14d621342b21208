"""The parallel first pass of ``ParquetTokenDataset``: pieces of row groups shared by
the node's processes, encoded by a pipeline of threads (rough edges:
``test_parquet_edges.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers
from text_helpers import converted_stream, make_corpus, reference_windows, write_parquet

from fastload import World
from fastload.cli import main as cli_main
from fastload.errors import ConfigError, SourceDataError
from fastload.storage import open_store
from fastload.text import ParquetTokenDataset, scan_parquet
from fastload.text.parquet_build import plan_pieces
from fastload.text.tokenize_pool import encode_ids, encode_pipeline

EOS = 2
SRC = Path(__file__).resolve().parents[2] / "src"


def parquet_dir(root: Path, corpus: list[str], files: int = 3, row_group_size: int = 50) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    step = -(-len(corpus) // files)
    for k in range(files):
        write_parquet(str(root / f"part-{k:03d}.parquet"), corpus[k * step : (k + 1) * step],
                      row_group_size=row_group_size)  # fmt: skip
    return root


def windows(ds: Any) -> list[tuple[int, ...]]:
    return [tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))]


# --------------------------------------------------------------- the pipeline


def test_encode_ids_matches_encode_batch_plus_eos_without_empty_documents(
    tokenizer_path: str, corpus: list[str]
) -> None:
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    tokens, lengths = encode_ids(tok, corpus, EOS, np.dtype("<u2"))
    assert tokens.dtype == np.dtype("<u2")
    assert tokens.tolist() == converted_stream(tokenizer_path, corpus, EOS)
    # a document without tokens is left out, as convert text does (no lone EOS)
    assert lengths.tolist() == [len(e.ids) + 1 for e in tok.encode_batch(corpus) if e.ids]
    empty_tokens, empty_lengths = encode_ids(tok, [], EOS, np.dtype("<u2"))
    assert empty_tokens.size == 0
    assert empty_lengths.size == 0
    with pytest.raises(ConfigError, match="does not fit"):
        encode_ids(tok, corpus, 70000, np.dtype("<u2"))


def test_pipeline_keeps_order_over_many_threads(tokenizer_path: str, corpus: list[str]) -> None:
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    batches = [(k, corpus[k : k + 7]) for k in range(0, len(corpus), 7)]
    out = list(encode_pipeline(tok, iter(batches), EOS, np.dtype("<u4"), threads=4, ahead=3))
    assert [tag for tag, _, _ in out] == [k for k, _ in batches]
    flat = np.concatenate([t for _, t, _ in out]).tolist()
    assert flat == converted_stream(tokenizer_path, corpus, EOS)


def test_pipeline_raises_a_reader_error_in_order_and_stops(
    tokenizer_path: str, corpus: list[str]
) -> None:
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)

    def batches() -> Any:
        for k in range(3):
            yield k, corpus[:5]
        raise SourceDataError("row 16: column 'text' is None, not a string", "x.parquet")

    it = encode_pipeline(tok, batches(), EOS, np.dtype("<u2"), threads=2)
    got = [next(it)[0] for _ in range(3)]
    with pytest.raises(SourceDataError, match=r"x\.parquet: row 16"):
        next(it)
    assert got == [0, 1, 2]  # every batch before the error was handed on
    # closing early stops the reader (of an endless stream) and the encoding threads
    endless = ((k, corpus[:3]) for k in range(10**9))
    it = encode_pipeline(tok, endless, EOS, np.dtype("<u2"), threads=2, ahead=2)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload-tokenize")]


def test_pieces_cover_every_row_group_once(tmp_path: Path, corpus: list[str]) -> None:
    files = scan_parquet(str(parquet_dir(tmp_path / "pq", corpus, files=3, row_group_size=7)))
    for n in (1, 4, 64, 1000):
        pieces = plan_pieces(files, n)
        groups = [(p.file, g) for p in pieces for g in range(p.first_group, p.end_group)]
        assert groups == [(k, g) for k, f in enumerate(files) for g in range(len(f.row_groups))]
        assert sum(p.rows for p in pieces) == len(corpus)
    assert len(plan_pieces(files, 1)) == 3  # a piece never spans files
    assert plan_pieces(files, 64) == plan_pieces(list(files), 64)  # pure


# -------------------------------------------------- processes sharing the work

CHILD = """
import json, sys
from fastload import World
from fastload.text import ParquetTokenDataset
ds = ParquetTokenDataset(sys.argv[1], tokenizer=sys.argv[2], seq_len=16, cache_dir=sys.argv[3],
                         shuffle=False, world=World.single(), threads=1)
print(json.dumps({"pieces": ds.pieces_tokenized_here, "published": ds.tokenized_here,
                  "dir": str(ds.token_dir), "first": ds[0]["input_ids"].tolist(),
                  "n": len(ds)}))
"""


def test_local_processes_share_the_pieces_and_publish_once(
    tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = make_corpus(600, seed=11)
    root = parquet_dir(tmp_path / "pq", corpus, files=4, row_group_size=10)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(SRC), "TOKENIZERS_PARALLELISM": "false"}
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(root), tokenizer_path, str(cache)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        for _ in range(3)
    ]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    pieces = plan_pieces(scan_parquet(str(root)))
    assert sum(r["pieces"] for r in results) == len(pieces)  # each piece tokenized once
    assert sum(r["published"] for r in results) == 1
    assert len({r["dir"] for r in results}) == 1
    ref = reference_windows(converted_stream(tokenizer_path, corpus, EOS), 16)
    assert all(r["n"] == len(ref) and r["first"] == ref[0][0] for r in results)
    assert not list((cache / "text" / "tokens").glob(".*"))  # pieces removed after publishing
    ds = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=16, cache_dir=cache,
                             shuffle=False, world=World.single())  # fmt: skip
    assert not ds.tokenized_here
    assert ds.pieces_tokenized_here == 0
    assert windows(ds) == [tuple(w[0]) for w in ref]


def test_tokens_from_s3_through_the_node_cache_and_cache_stats(
    seaweed: Any, tmp_path: Path, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(240, seed=12)
    root = parquet_dir(tmp_path / "pq", corpus, files=3, row_group_size=20)
    url, opts = seaweed.new_url("pq"), seaweed.storage_options
    store = open_store(url, opts)
    for p in sorted(root.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    sizes = sum(p.stat().st_size for p in root.iterdir())
    cache = tmp_path / "cache"
    ds = ParquetTokenDataset(url, tokenizer=tokenizer_path, seq_len=16, cache_dir=cache,
                             storage_options=opts, shuffle=False, world=World.single())  # fmt: skip
    assert sizes <= ds.source_remote_bytes() < sizes + 4 * 2**16  # each file once + footers
    ref = reference_windows(converted_stream(tokenizer_path, corpus, EOS), 16)
    assert windows(ds) == [tuple(w[0]) for w in ref]
    assert cli_main(["cache", "stats", "--cache-dir", str(cache), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [tokens] = doc["token_datasets"]
    assert tokens["key"] == ds.token_dir.name
    assert tokens["tokens"] == ds.layout.num_tokens
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    # the documents with tokens: an empty one is left out (no lone EOS)
    assert tokens["documents"] == sum(1 for e in tok.encode_batch(corpus) if e.ids)


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_a_piece_whose_holder_dies_is_taken_over(tmp_path: Path, tokenizer_path: str) -> None:
    corpus = make_corpus(200, seed=13)
    root = parquet_dir(tmp_path / "pq", corpus, files=2, row_group_size=20)
    first = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=16,
                                cache_dir=tmp_path / "a", shuffle=False)  # fmt: skip
    key = first.token_dir.name  # the key does not depend on the cache directory
    pieces_dir = tmp_path / "b" / "text" / "tokens" / f".{key}.pieces"
    pieces_dir.mkdir(parents=True)
    n = len(plan_pieces(first.files))
    # another process holds piece 0 (as a rank tokenizing it would), then dies
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(pieces_dir / "000000.lock")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        result: dict[str, Any] = {}

        def build() -> None:
            try:
                result["ds"] = ParquetTokenDataset(str(root), tokenizer=tokenizer_path,
                                                   seq_len=16, cache_dir=tmp_path / "b",
                                                   shuffle=False)  # fmt: skip
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=build)
        t.start()
        # every other piece gets tokenized while piece 0 waits for its holder
        for _ in range(6000):
            if len(list(pieces_dir.glob("*.npz"))) == n - 1 or not t.is_alive():
                break
            t.join(0.05)
        assert sorted(p.name for p in pieces_dir.glob("*.npz"))[0] == "000001.npz"
        assert t.is_alive()  # still waiting on piece 0
    finally:
        holder.kill()
        holder.wait()
    t.join(120)
    assert not t.is_alive()
    assert "error" not in result, result.get("error")
    ds = result["ds"]
    assert ds.tokenized_here
    assert ds.pieces_tokenized_here == n  # piece 0 taken over once its holder died
    assert windows(ds) == windows(first)


def test_files_opened_by_racing_threads_are_fetched_and_counted_once(
    seaweed: Any, tmp_path: Path
) -> None:
    from fastload.config import CacheConfig
    from fastload.text.parquet_files import ParquetFileCache

    corpus = make_corpus(160, seed=14)
    root = parquet_dir(tmp_path / "pq", corpus, files=4, row_group_size=20)
    url, opts = seaweed.new_url("pq"), seaweed.storage_options
    store = open_store(url, opts)
    for p in sorted(root.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    files = scan_parquet(url, opts)
    cache = ParquetFileCache(files, opts, CacheConfig(cache_dir=str(tmp_path / "c")), None, 8)
    start = threading.Barrier(8)
    seen: dict[int, bytes] = {}

    def open_one(k: int) -> None:
        start.wait()
        seen[k] = bytes(cache.open(k))

    threads = [threading.Thread(target=open_one, args=(k % 4,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        for k in range(4):
            assert seen[k] == (root / f"part-{k:03d}.parquet").read_bytes()
        # every file fetched once, and every byte counted by the one store per root
        assert cache.remote_bytes() == sum(f.size for f in files)
    finally:
        cache.close()
