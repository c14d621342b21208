"""Benchmark of ``fastload.Mix`` against reading the same items from its sources
directly, in the same run: three local token datasets of 50,000, 30,000 and 20,000
one-token windows (written without a tokenizer), iterated shuffled one after another
(``direct``) and mixed 0.5/0.3/0.2 (``mix``, the same 100,000 windows). The cases
alternate after a warm-up; the ratio of medians is what the mixture's planning and
per-item dispatch cost.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_mix.py [--repeats 5 --json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastload
from fastload import World
from fastload.shards.writer import ShardWriter
from fastload.text.writer import TokenShardWriter

SIZES = (50_000, 30_000, 20_000)
WEIGHTS = (0.5, 0.3, 0.2)


def write_tokens(url: str, windows: int) -> None:
    """A uint32 token dataset of ``windows + 1`` tokens (seq_len=1: ``windows`` windows)."""
    meta: dict[str, Any] = {"kind": "tokens", "dtype": "uint32", "vocab_size": 2**32 - 1,
                            "eos_id": -1, "field": "text"}  # fmt: skip
    writer = ShardWriter(url, "16KB", None, meta)
    shards = TokenShardWriter(writer, np.dtype("<u4"))
    tokens = np.arange(windows + 1, dtype="<u4")
    lengths = np.diff(np.append(np.arange(0, tokens.size, 1000), tokens.size))
    shards.add(tokens, lengths)
    shards.close()
    meta.update(tokens=int(tokens.size), documents=int(lengths.size),
                shard_tokens=shards.shard_tokens, shard_docs=shards.shard_docs)  # fmt: skip
    writer.source = meta
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-mix-"))
    urls = [str(root / f"t{i}") for i in range(len(SIZES))]
    for url, n in zip(urls, SIZES, strict=True):
        write_tokens(url, n)

    def sources() -> list[Any]:
        return [
            fastload.TokenDataset(u, seq_len=1, shuffle=True, world=World.single()) for u in urls
        ]

    def direct() -> int:
        return sum(1 for ds in sources() for _ in ds)

    def mix() -> int:
        return sum(1 for _ in fastload.Mix(sources(), weights=WEIGHTS, world=World.single()))

    cases = {"direct": direct, "mix": mix}
    for fn in cases.values():  # warm-up: page cache, imports
        assert fn() == sum(SIZES)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        rate = sum(SIZES) / med[k]
        print(
            f"{k:7s} median {med[k]:.3f} s  ({rate:,.0f} items/s)  runs {[round(x, 3) for x in v]}"
        )
    ratio = med["mix"] / med["direct"]
    print(f"mix / direct time: {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
