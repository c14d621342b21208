"""Benchmark of the disk tier against plain file I/O measured in the same run.

* warm hit: ``DiskTier.get`` (a catalog transaction) + mmap + copy every byte out, and
  the same through ``ShardCache.open_shard`` (pin, mmap, unpin), vs a plain sequential
  ``readinto`` of the same files (all page-cache warm);
* miss: ``DiskTier.get`` fetching from a local source file (temp file, copy, fsync,
  xxh3-128 re-read, rename, catalog) vs a plain copy, and a plain copy + fsync.

* ``--catalog 100,10000,100000``: open+close of a cached shard with that many catalog
  entries (hot, and with an LRU write), against a plain open+mmap+close in the same run.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_cache.py [--files 8 --size 32MB
--repeats 5 --json out.json]``. Prints one line per case (median, spread, GB/s) and the
ratios; ``--json`` writes them with environment facts.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from fastload.cache import DiskTier, EntryKey, ShardCache
from fastload.config import parse_size
from fastload.shards.checksum import file_checksum
from fastload.shards.manifest import ShardInfo


def timed(cases: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Time each case ``repeats`` times after a warm-up, interleaving the cases so that
    drift in machine load hits baseline and cache path alike."""
    for fn in cases.values():
        fn()  # warm-up
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    return out


def summary(name: str, times: list[float], nbytes: int) -> dict[str, Any]:
    med = statistics.median(times)
    row = {
        "case": name,
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "gb_per_s": nbytes / med / 1e9,
    }
    print(
        f"{name:<34} median {med * 1e3:8.1f} ms  [{min(times) * 1e3:.1f}..{max(times) * 1e3:.1f}]"
        f"  {row['gb_per_s']:6.2f} GB/s",
        flush=True,
    )
    return row


def catalog_scaling(scratch: Path, counts: list[int], iters: int) -> list[dict[str, Any]]:
    """Open+close of one cached shard through ``ShardCache`` with the catalog holding
    ``n`` other READY entries, against a plain ``open`` + ``mmap`` + ``close`` of the same
    file in the same run. "hot": the entry is among the recently used half (the open
    writes nothing to sqlite); "touch": its LRU position is made old before each timed
    open (excluded from the timing), so the open writes its new position."""
    rows = []
    data = os.urandom(64 * 1024)
    from fastload.shards.checksum import xxh3_128

    info = ShardInfo(
        name="shard-000000.tar",
        samples=1,
        bytes=len(data),
        checksum=xxh3_128(data),
        index_name="shard-000000.idx",
        index_bytes=0,
        index_checksum=xxh3_128(b""),
    )
    for n in counts:
        root = scratch / f"catalog-{n}"
        cache = ShardCache(root)
        assert cache.disk is not None
        cat = cache.disk.catalog
        with cat.txn() as conn:  # n other entries (rows only: their files are not needed)
            conn.executemany(
                "INSERT INTO entries(name, dataset, shard, checksum, size, state, last_use, "
                "touched, error, failed_at) VALUES (?, 'ds', ?, ?, 4096, 3, ?, 0, NULL, NULL)",
                (
                    (f"{i:016x}/{i:032x}-s{i}.tar", f"s{i}.tar", f"xxh3_128:{i:032x}", i + 1)
                    for i in range(n)
                ),
            )
            conn.execute("UPDATE meta SET value=? WHERE key='clock'", (n + 1,))
        fetch = lambda f: f.write(data)  # noqa: E731
        cache.open_shard("bench", info, fetch).close()  # fetched once
        key = ShardCache.key("bench", info)
        path = cache.disk.path_for(key)

        # (the closures run within this iteration only)
        def plain() -> None:
            with open(path, "rb") as f:  # noqa: B023
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                m.close()

        def hot() -> None:
            cache.open_shard("bench", info, fetch).close()  # noqa: B023

        def age() -> None:
            with cat.txn() as conn:  # noqa: B023
                conn.execute("UPDATE entries SET last_use=0 WHERE name=?", (key.name,))  # noqa: B023

        results: dict[str, list[float]] = {"plain": [], "hot": [], "touch": []}
        for _ in range(iters):
            for case, fn in (("plain", plain), ("hot", hot), ("touch", hot)):
                if case == "touch":
                    age()
                t0 = time.perf_counter()
                fn()
                results[case].append(time.perf_counter() - t0)
        row = {"entries": n, **{f"{k}_us": statistics.median(v) * 1e6 for k, v in results.items()}}
        row["hot_ratio"] = row["hot_us"] / row["plain_us"]
        row["touch_ratio"] = row["touch_us"] / row["plain_us"]
        rows.append(row)
        print(
            f"catalog {n:>7} entries: open+close hot {row['hot_us']:7.1f} us, "
            f"touch {row['touch_us']:7.1f} us, plain open+mmap+close {row['plain_us']:6.1f} us",
            flush=True,
        )
        cache.close()
    base = rows[0]
    for row in rows:
        row["hot_vs_smallest"] = row["hot_us"] / base["hot_us"]
        row["touch_vs_smallest"] = row["touch_us"] / base["touch_us"]
        print(
            f"ratio {row['entries']:>7} vs {base['entries']} entries: hot "
            f"{row['hot_vs_smallest']:.2f}x, touch {row['touch_vs_smallest']:.2f}x",
            flush=True,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--catalog",
        default=None,
        help="instead: open+close cost at these catalog sizes, e.g. 100,10000,100000",
    )
    ap.add_argument("--iters", type=int, default=500, help="timed opens per size (--catalog)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--size", default="32MB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()
    size = parse_size(args.size)
    scratch = Path(tempfile.mkdtemp(prefix="fastload-bench-", dir=args.dir))
    if args.catalog:
        try:
            counts = [int(c) for c in args.catalog.split(",")]
            rows = catalog_scaling(scratch, counts, args.iters)
            if args.json:
                doc = {"version": 1, "benchmark": "cache-catalog", "command": " ".join(sys.argv)}
                Path(args.json).write_text(json.dumps({**doc, "results": rows}, indent=1))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    try:
        src = scratch / "src"
        src.mkdir()
        infos = []
        for i in range(args.files):
            p = src / f"shard-{i:06d}.tar"
            with open(p, "wb") as f:
                for _ in range(0, size, 2**22):
                    f.write(os.urandom(min(2**22, size)))
                f.truncate(size)
            n, checksum = file_checksum(p)
            infos.append(ShardInfo(p.name, n, 1, checksum, p.name + ".idx", 0, checksum))
        total = size * args.files
        buf = bytearray(size)
        dataset = src.as_uri()
        keys = [EntryKey(dataset, s.name, s.checksum) for s in infos]

        def fetcher(name: str) -> Callable[[BinaryIO], None]:
            def fetch(f: BinaryIO) -> None:
                with open(src / name, "rb") as g:
                    shutil.copyfileobj(g, f, 2**22)

            return fetch

        # ------------------------------------------------------------- misses
        copies = scratch / "copies"

        def plain_copy(fsync: bool) -> Callable[[], None]:
            def run() -> None:
                shutil.rmtree(copies, ignore_errors=True)
                copies.mkdir()
                for s in infos:
                    with open(src / s.name, "rb") as g, open(copies / s.name, "wb") as f:
                        shutil.copyfileobj(g, f, 2**22)
                        if fsync:
                            f.flush()
                            os.fsync(f.fileno())

            return run

        def tier_miss() -> None:
            root = scratch / "miss-cache"
            shutil.rmtree(root, ignore_errors=True)
            tier = DiskTier(root)
            for k, s in zip(keys, infos, strict=True):
                tier.get(k, s.bytes, fetcher(s.name))
            tier.close()

        misses = {
            "miss: plain copy": plain_copy(False),
            "miss: plain copy + fsync": plain_copy(True),
            "miss: DiskTier.get (fetch+verify)": tier_miss,
        }
        rows = [summary(k, v, total) for k, v in timed(misses, args.repeats).items()]

        # --------------------------------------------------------------- hits
        root = scratch / "cache"
        tier = DiskTier(root)
        paths = [tier.get(k, s.bytes, fetcher(s.name)) for k, s in zip(keys, infos, strict=True)]

        def plain_read() -> None:
            for p in paths:
                with open(p, "rb", buffering=0) as f:
                    f.readinto(buf)

        def tier_hit() -> None:
            for k, s in zip(keys, infos, strict=True):
                p = tier.get(k, s.bytes, fetcher(s.name))
                with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    buf[:] = m

        cache = ShardCache(root)

        def facade_hit() -> None:
            for s in infos:
                with cache.open_shard(dataset, s, fetcher(s.name)) as shard:
                    buf[:] = shard.data

        hits = {
            "hit: plain sequential read": plain_read,
            "hit: DiskTier.get + mmap + copy": tier_hit,
            "hit: ShardCache.open_shard + copy": facade_hit,
        }
        rows += [summary(k, v, total) for k, v in timed(hits, args.repeats).items()]
        med = {r["case"]: r["median_s"] for r in rows}
        ratios = {
            "hit_tier_vs_plain": med["hit: plain sequential read"]
            / med["hit: DiskTier.get + mmap + copy"],
            "hit_facade_vs_plain": med["hit: plain sequential read"]
            / med["hit: ShardCache.open_shard + copy"],
            "miss_tier_vs_copy": med["miss: plain copy"] / med["miss: DiskTier.get (fetch+verify)"],
            "miss_tier_vs_copy_fsync": med["miss: plain copy + fsync"]
            / med["miss: DiskTier.get (fetch+verify)"],
        }
        for k, v in ratios.items():
            print(f"ratio {k:<26} {v:.2f}x (throughput of the cache path / baseline)")
        if args.json:
            doc = {
                "version": 1,
                "benchmark": "cache",
                "command": " ".join(sys.argv),
                "files": args.files,
                "file_bytes": size,
                "repeats": args.repeats,
                "env": {
                    "python": platform.python_version(),
                    "machine": platform.machine(),
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                },
                "results": rows,
                "ratios": ratios,
            }
            Path(args.json).write_text(json.dumps(doc, indent=1))
        tier.close()
        cache.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
