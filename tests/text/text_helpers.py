"""Generated text, an offline tokenizer and source files for the text tests."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.text import synthetic

_WORDS = [
    "the",
    "a",
    "of",
    "data",
    "node",
    "cache",
    "token",
    "shard",
    "window",
    "epoch",
    "rank",
    "worker",
    "model",
    "fine",
    "tune",
    "lora",
    "layer",
    "attention",
    "query",
    "key",
    "value",
    "gradient",
    "batch",
    "sequence",
    "document",
    "stream",
    "object",
    "storage",
    "disk",
    "read",
    "write",
    "fast",
    "slow",
    "resume",
    "state",
    "seed",
    "order",
    "split",
]


def make_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 0..120 words (every 37th empty), deterministic in ``seed``."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = 0 if i % 37 == 5 else rng.randint(1, 120)
        docs.append(" ".join(rng.choice(_WORDS) for _ in range(words)) + ("." if words else ""))
    return docs


def train_tokenizer(corpus: Sequence[str], path: str, vocab_size: int = 300) -> Any:
    """Train a byte-level BPE tokenizer on ``corpus`` and save it at ``path`` (a small
    vocabulary: the tests' corpora are small)."""
    return synthetic.train_tokenizer(corpus, path, vocab_size=vocab_size)


def write_jsonl(path: str, docs: Sequence[str], field: str = "text") -> str:
    """Write ``docs`` as JSONL (gzip for ``.gz``, zstd for ``.zst``); returns ``path``."""
    data = "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data)
    elif path.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def write_parquet(path: str, docs: Sequence[str], row_group_size: int = 50) -> str:
    """Write ``docs`` as a parquet file with ``text`` and ``id`` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": list(docs), "id": list(range(len(docs)))})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def reference_stream(tokenizer_path: str, docs: Sequence[str], eos: int) -> list[int]:
    """``Tokenizer.encode_batch`` plus EOS after every document, concatenated."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    out: list[int] = []
    for enc in tok.encode_batch(list(docs)):
        out.extend(enc.ids)
        out.append(eos)
    return out


def reference_windows(stream: Sequence[int], seq_len: int) -> list[tuple[list[int], list[int]]]:
    """The straightforward packing: window k is tokens [k*L, (k+1)*L] inclusive."""
    out = []
    k = 0
    while (k + 1) * seq_len < len(stream):
        w = list(stream[k * seq_len : (k + 1) * seq_len + 1])
        out.append((w[:-1], w[1:]))
        k += 1
    return out


def converted_stream(tokenizer_path: str, docs: Sequence[str], eos: int) -> list[int]:
    """What ``convert text`` writes: :func:`reference_stream` of the documents that
    have tokens (an empty document is left out, not written as a lone EOS)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    kept = [d for d, e in zip(docs, tok.encode_batch(list(docs)), strict=True) if e.ids]
    return reference_stream(tokenizer_path, kept, eos)


def doc_starts(tokenizer_path: str, docs: Sequence[str], eos: int) -> np.ndarray:
    """Global start offset of every document ``convert text`` writes (those with
    tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    lengths = [len(e.ids) + 1 for e in tok.encode_batch(list(docs)) if e.ids]
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
