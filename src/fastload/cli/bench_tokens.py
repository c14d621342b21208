"""``fastload bench URL`` for a token dataset (manifest ``kind: "tokens"``): tokens/s
of ``TokenDataset`` windows through ``fastload.DataLoader``, cold (fetching into the
cache) and warm, with the dataset's facts. Called by :mod:`fastload.cli.bench`."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

__all__ = ["bench_seq_len", "is_token_dataset", "run_tokens"]


def is_token_dataset(url: str, storage_options: dict[str, Any] | None) -> bool:
    """Whether ``url`` holds token shards (False when it has no readable manifest:
    the image bench then reports what is wrong)."""
    from fastload.errors import FastloadError
    from fastload.shards.manifest import Manifest

    try:
        return Manifest.load(url, storage_options).kind == "tokens"
    except (FastloadError, OSError):
        return False


def bench_seq_len(tokens: int, batch_size: int) -> int:
    """2048, or less so that a small dataset still makes a few batches."""
    return max(1, min(2048, (tokens - 1) // max(1, 4 * batch_size)))


def _epoch(loader: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += int(batch["input_ids"].numel())
    return time.perf_counter() - t0, n


def run_tokens(args: argparse.Namespace, storage_options: dict[str, Any] | None) -> int:
    """Measure a cold and ``--epochs`` warm epochs; print a table (and ``--json``)."""
    import fastload
    from fastload.text import TokenDataset

    own = args.cache_dir is None
    cache_dir = tempfile.mkdtemp(prefix="fastload-bench-") if own else args.cache_dir
    try:
        ds = TokenDataset(args.url, seq_len=1, cache_dir=cache_dir, shuffle=False,
                          cache_limit=args.cache_limit,
                          storage_options=storage_options)  # fmt: skip
        seq_len = bench_seq_len(ds.num_tokens, args.batch_size)
        ds = TokenDataset(args.url, seq_len=seq_len, cache_dir=cache_dir, shuffle=False,
                          cache_limit=args.cache_limit, storage_options=storage_options,
                          manifest=ds.manifest)  # fmt: skip
        loader = fastload.DataLoader(
            ds, batch_size=args.batch_size, num_workers=args.workers, drop_last=True,
            persistent_workers=args.workers > 0,
        )  # fmt: skip
        cold_s, tokens = _epoch(loader)
        remote = int(loader.io_stats().get("remote_bytes", 0))
        warm = [_epoch(loader)[0] for _ in range(max(1, args.epochs))]
        ds.close()
    finally:
        if own:
            shutil.rmtree(cache_dir, ignore_errors=True)
    meta = ds.manifest.source
    warm_s = statistics.median(warm)
    doc = {
        "version": 1,
        "kind": "tokens",
        "url": args.url,
        "dtype": meta.get("dtype"),
        "tokens": ds.num_tokens,
        "documents": meta.get("documents"),
        "seq_len": seq_len,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "tokens_per_epoch": tokens,
        "cold": {"seconds": cold_s, "tokens_per_s": tokens / cold_s, "remote_bytes": remote},
        "warm": {"seconds": warm_s, "tokens_per_s": tokens / warm_s, "epochs": len(warm)},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(f"token dataset {args.url}: {ds.num_tokens} {meta.get('dtype')} tokens, "
          f"{meta.get('documents')} documents; windows of {seq_len}, batch {args.batch_size}, "
          f"{args.workers} workers")  # fmt: skip
    print(f"cold epoch  {tokens / cold_s / 1e6:10.2f} M tokens/s  ({cold_s:.2f} s, "
          f"{remote / 1e6:.1f} MB from the store)")  # fmt: skip
    print(f"warm epoch  {tokens / warm_s / 1e6:10.2f} M tokens/s  ({warm_s:.2f} s, median "
          f"of {len(warm)})")  # fmt: skip
    if not args.quiet and sys.stderr.isatty():
        print("(tokens/s counts input_ids; windows are read from the NVMe cache when warm)",
              file=sys.stderr)  # fmt: skip
    return 0
