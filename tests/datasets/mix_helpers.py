"""Sources for the mixture tests: token shards whose windows name themselves (written
directly, no tokenizer: window ``k`` of seq_len 1 is token ``base + k``), and the
per-source checks those tests share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.shards.writer import ShardWriter
from fastload.text.writer import TokenShardWriter

#: token ids of source i start at i * BASE: an item's first token names its source
BASE = 1_000_000


def write_tokens(
    url: str,
    windows: int,
    base: int,
    shard_size: str = "16KB",
    storage_options: dict[str, Any] | None = None,
) -> None:
    """A token dataset at ``url`` of ``windows + 1`` tokens ``base, base+1, ...`` (uint32,
    one document per 1,000 tokens): with ``seq_len=1`` window k is ``[base + k]``."""
    dtype = np.dtype("<u4")
    meta: dict[str, Any] = {"kind": "tokens", "dtype": "uint32", "vocab_size": 2**32 - 1,
                            "eos_id": -1, "field": "text"}  # fmt: skip
    writer = ShardWriter(url, shard_size, storage_options, meta)
    shards = TokenShardWriter(writer, dtype)
    tokens = np.arange(base, base + windows + 1, dtype=dtype)
    lengths = np.diff(np.append(np.arange(0, tokens.size, 1000), tokens.size))
    shards.add(tokens, lengths)
    shards.close()
    meta.update(tokens=int(tokens.size), documents=int(lengths.size),
                shard_tokens=shards.shard_tokens, shard_docs=shards.shard_docs)  # fmt: skip
    writer.source = meta
    writer.close()


def token_ids(items: Sequence[Any]) -> list[int]:
    """The first token of each token item (or of each row of a collated batch)."""
    out: list[int] = []
    for item in items:
        ids = item["input_ids"]
        out += ids.reshape(-1, ids.shape[-1])[:, 0].tolist()
    return out


def check_source_epochs(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Split a mixed stream of self-naming ids by source; assert that each source's
    items, cut into runs of its epoch size, repeat nothing within a run (a complete run
    is a permutation of the source). Returns each source's item numbers in order."""
    per: list[list[int]] = [[] for _ in sizes]
    for t in ids:
        per[t // BASE].append(t % BASE)
    for i, n in enumerate(sizes):
        for a in range(0, len(per[i]), n):
            run = per[i][a : a + n]
            assert len(set(run)) == len(run), f"source {i} repeats within an epoch"
            assert set(run) <= set(range(n))
            if len(run) == n:
                assert sorted(run) == list(range(n))
    return per


def within_one_of_share(ids: Sequence[int], weights: Sequence[float]) -> float:
    """The largest |count - T * w_i| over every prefix T of a mixed stream."""
    src = np.asarray(ids, dtype=np.int64) // BASE
    counts = np.cumsum(np.eye(len(weights), dtype=np.int64)[src], axis=0)
    t = np.arange(1, src.size + 1)[:, None]
    return float(np.abs(counts - t * np.asarray(weights)[None, :]).max())
