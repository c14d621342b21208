"""Shuffle quality and planning time of fastload's epoch order.

Compares the windowed shard shuffle (several window sizes) with a full
``rng.permutation`` of all samples measured in the same run, on a dataset whose
shards are *sorted* (e.g. one class per shard: the worst case for a shard-local
shuffle). Quality measures, for each order:

* ``same_shard_adjacent``: fraction of adjacent pairs in the order from the same
  shard (full shuffle ≈ 1/S);
* ``shards_per_batch``: mean number of distinct shards in a batch of ``--batch``
  consecutive samples (how many "classes" a batch mixes);
* ``gap_p10/p50/p90``: for manifest neighbours i, i+1 of the same shard, the
  distance |pos(i+1) - pos(i)| in the epoch order (full shuffle: median ≈ 0.29 N);
* ``abs_spearman``: |rank correlation| of manifest position and epoch position,
  mean over ``--epochs`` epochs (≈ 0 for a good shuffle; its noise is ≈ 1/sqrt(S)
  for a shard-level shuffle, 1/sqrt(N) for a full one);
* ``open_shards``: shards a sequential reader has open at once (first to last use
  overlapping), the quantity the cache has to hold.

Planning time: ``plan_rank`` for 10M samples over 8,000 ranks (1,000 nodes × 8) and
over one node of 8 ranks, ``map_rank_indices`` over 8,000 ranks, against the time of
``rng.permutation(10M)``; median and min-max of ``--repeats``.

usage: .venv/bin/python benchmarks/bench_shuffle.py [--samples 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastload.sampling import (
    World,
    epoch_order,
    map_rank_indices,
    plan_rank,
    shard_of,
)


def abs_spearman(order: np.ndarray) -> float:
    """|Spearman correlation| of manifest position and position in ``order``."""
    n = order.size
    pos = np.empty(n, dtype=np.float64)
    pos[order] = np.arange(n, dtype=np.float64)
    # both are ranks already (positions of a permutation)
    return abs(float(np.corrcoef(np.arange(n, dtype=np.float64), pos)[0, 1]))


def quality(orders: list[np.ndarray], counts: np.ndarray, batch: int) -> dict[str, float]:
    """Shuffle-quality measures of ``orders[0]`` (a permutation of 0..N-1); the
    correlation is averaged over all of ``orders`` (other epochs)."""
    order = orders[0]
    n = order.size
    shards = shard_of(order, counts)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    manifest_shard = shard_of(np.arange(n), counts)
    same = manifest_shard[1:] == manifest_shard[:-1]
    gaps = np.abs(pos[1:] - pos[:-1])[same]
    full = n // batch * batch
    per_batch = shards[:full].reshape(-1, batch)
    sorted_rows = np.sort(per_batch, axis=1)
    distinct = 1 + np.count_nonzero(np.diff(sorted_rows, axis=1), axis=1)
    first = np.full(counts.size, n, dtype=np.int64)
    last = np.full(counts.size, -1, dtype=np.int64)
    np.minimum.at(first, shards, np.arange(n))
    np.maximum.at(last, shards, np.arange(n))
    events = np.zeros(n + 1, dtype=np.int64)
    np.add.at(events, first, 1)
    np.add.at(events, last + 1, -1)
    open_shards = int(np.cumsum(events).max())
    return {
        "same_shard_adjacent": float(np.mean(shards[1:] == shards[:-1])),
        "shards_per_batch": float(distinct.mean()),
        "gap_p10": float(np.percentile(gaps, 10)),
        "gap_p50": float(np.percentile(gaps, 50)),
        "gap_p90": float(np.percentile(gaps, 90)),
        "abs_spearman": float(np.mean([abs_spearman(o) for o in orders])),
        "open_shards": open_shards,
    }


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000, help="samples for quality")
    ap.add_argument("--shard-samples", type=int, default=1000, help="samples per shard")
    ap.add_argument("--windows", default="1,2,4,8,16,64", help="window sizes (shards)")
    ap.add_argument("--batch", type=int, default=256, help="batch for shards_per_batch")
    ap.add_argument("--plan-samples", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5, help="epochs for abs_spearman")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args(argv)

    n, m = args.samples, args.shard_samples
    counts = np.full(-(-n // m), m, dtype=np.int64)
    counts[-1] = n - m * (counts.size - 1)
    rng = np.random.Generator(np.random.PCG64(0))
    rows: list[dict[str, Any]] = []
    epochs = range(args.epochs)
    baseline = quality([rng.permutation(n) for _ in epochs], counts, args.batch)
    rows.append({"order": "rng.permutation (baseline)", **baseline})
    for w in [int(x) for x in args.windows.split(",")]:
        for nodes in (1, 8):
            orders = [
                epoch_order(counts, seed=0, epoch=e, window_shards=w, canonical_nodes=nodes)
                for e in epochs
            ]
            rows.append({"order": f"window={w} C={nodes}", **quality(orders, counts, args.batch)})

    print(f"# shuffle quality: N={n:,} samples in {counts.size:,} sorted shards of {m}")
    cols = [
        "same_shard_adjacent",
        "shards_per_batch",
        "gap_p10",
        "gap_p50",
        "gap_p90",
        "abs_spearman",
        "open_shards",
    ]
    print(f"{'order':28s}" + "".join(f"{c:>20s}" for c in cols))
    for row in rows:
        print(f"{row['order']:28s}" + "".join(f"{row[c]:20.4g}" for c in cols))

    # ---------------------------------------------------------------- planning time
    pn = args.plan_samples
    pcounts = np.full(-(-pn // m), m, dtype=np.int64)
    pcounts[-1] = pn - m * (pcounts.size - 1)
    big = World.of(4321, 8000, ranks_per_node=8)
    one_node = World.of(3, 8, ranks_per_node=8)
    timings = {
        "rng.permutation(N) (baseline)": timed(
            lambda: np.random.Generator(np.random.PCG64(1)).permutation(pn), args.repeats
        ),
        "plan_rank, 1000 nodes x 8 ranks": timed(
            lambda: plan_rank(pcounts, 0, 0, big, 32), args.repeats
        ),
        "plan_rank, 1 node x 8 ranks": timed(
            lambda: plan_rank(pcounts, 0, 0, one_node, 32), args.repeats
        ),
        "map_rank_indices, 8000 ranks": timed(
            lambda: map_rank_indices(pn, 0, 0, big, 32), args.repeats
        ),
        "epoch_order (whole epoch, C=1)": timed(
            lambda: epoch_order(pcounts, 0, 0, canonical_nodes=1), args.repeats
        ),
    }
    base = timings["rng.permutation(N) (baseline)"]["median_s"]
    load = os.getloadavg()[0]
    print(
        f"\n# planning time per rank: N={pn:,} samples, {pcounts.size:,} shards, batch 32 "
        f"(numpy {np.__version__}, {os.cpu_count()} CPUs, load {load:.1f})"
    )
    print(f"{'what':36s}{'median s':>12s}{'min s':>10s}{'max s':>10s}{'vs baseline':>14s}")
    for name, t in timings.items():
        print(
            f"{name:36s}{t['median_s']:12.4f}{t['min_s']:10.4f}{t['max_s']:10.4f}"
            f"{t['median_s'] / base:13.4g}x"
        )

    result = {
        "version": 1,
        "benchmark": "shuffle",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m": os.getloadavg()[0],
        },
        "quality": {"samples": n, "shard_samples": m, "batch": args.batch, "rows": rows},
        "planning": {"samples": pn, "shards": int(pcounts.size), "timings": timings},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
