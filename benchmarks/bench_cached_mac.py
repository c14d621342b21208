"""What authenticating ``fastload.cached()`` items costs on a cache hit.

A hit used to be ``pread`` + an xxh3-128 check + ``pickle.loads``; it is now ``pread``
+ an HMAC-SHA256 check + ``pickle.loads``. This script fills a ``cached()`` cache with
items of a few sizes and times, in the same run and over the same item bytes:

* ``hit``       a real ``CachedDataset[i]`` hit (catalog lookup, pread, HMAC, unpickle)
* ``old check`` ``pread`` + xxh3-128 + ``pickle.loads`` of the same row: the old hit
                without its catalog lookup
* ``new check`` ``pread`` + HMAC-SHA256 + ``pickle.loads`` of the same row

and prints the medians (CPU time of this process, which a shared machine disturbs
less than wall time) and the ratio new/old. A hit costs the catalog lookup on top.

usage: python benchmarks/bench_cached_mac.py [--repeats R] [--items N]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import pickle
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from fastload.datasets.cached import cached
from fastload.shards.checksum import xxh3_128


class Arrays:
    """``n`` uint8 arrays of ``size`` bytes (an image-sized item)."""

    def __init__(self, n: int, size: int) -> None:
        self.n = n
        self.size = size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.full(self.size, i % 251, dtype=np.uint8)


def _cpu(fn: Any, rounds: int) -> float:
    t = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - t) / rounds


def measure(size: int, items: int, repeats: int) -> dict[str, float]:
    """Median CPU seconds per item of a hit, the old check and the new one."""
    with tempfile.TemporaryDirectory() as d:
        ds = cached(Arrays(items, size), cache_dir=d, key=f"bench-{size}")
        for i in range(items):
            ds[i]
        rows = ds._conn().execute("SELECT i, shard, offset, size FROM items ORDER BY i").fetchall()
        key = ds._mac_key
        assert key is not None
        tag = ds.root.name.encode() + b"\0"
        fds = {name: os.open(ds.root / name, os.O_RDONLY) for _, name, _, _ in rows}

        def hits() -> None:
            for i in range(items):
                ds[i]

        def old() -> None:
            for _, name, off, n in rows:
                data = os.pread(fds[name], n, off)
                xxh3_128(data)
                pickle.loads(data)

        def new() -> None:
            for i, name, off, n in rows:
                data = os.pread(fds[name], n, off)
                h = hmac.new(key, digestmod=hashlib.sha256)
                h.update(tag + i.to_bytes(8, "little"))
                h.update(data)
                h.hexdigest()
                pickle.loads(data)

        med = {}
        for name, fn in (("hit", hits), ("old", old), ("new", new)):
            fn()  # warm-up
            med[name] = statistics.median(_cpu(fn, 1) for _ in range(repeats)) / items
        for fd in fds.values():
            os.close(fd)
        ds.close()
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--items", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("FASTLOAD_CONFIG_DIR", tempfile.mkdtemp(prefix="fastload-bench-"))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(
        f"{'item bytes':>10} {'hit us':>9} {'old check us':>13} {'new check us':>13} {'new/old':>8}"
    )
    for size in (4_000, 150_000, 1_500_000):
        med = measure(size, args.items, args.repeats)
        print(
            f"{size:>10} {med['hit'] * 1e6:>9.1f} {med['old'] * 1e6:>13.1f} "
            f"{med['new'] * 1e6:>13.1f} {med['new'] / med['old']:>7.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
