"""Storage throughput: ObjectStore.download vs the server's ceiling vs plain s3fs.

Usage::

    python benchmarks/bench_storage.py --seaweed [--size 256MB] [--repeats 5] [--json out.json]
    python benchmarks/bench_storage.py s3://bucket/prefix --storage-options '{"key": ...}'

Against one large object, in one run: (a) the ceiling: many parallel ranged GETs with
nothing written (raw aiobotocore GETs whose bodies are dropped, s3fs ``_cat_file``
gathered on fsspec's loop, a thread pool of ``fs.cat_file``; the fastest counts);
(b) ``ObjectStore.download`` to a local file (``--dest-dir``) with the default
FetchConfig and with ``concurrency=--threads``; (c) plain s3fs ``cat_file`` (one GET).
Also (bound) the raw GETs each pwritten at its offset from the event loop: the cost of
a download with nothing else. Prints MB/s (median of the repeats, min, max) and ratios
to the ceiling and the bound (medians of per-round ratios: every round times each case
back to back, so load drifting between rounds cancels); ``--json`` writes it all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from _ranged_get import ranged_gets  # noqa: E402
from fastload.bench import LocalS3  # noqa: E402
from fastload.config import FetchConfig, parse_size  # noqa: E402
from fastload.storage import open_store  # noqa: E402
from fastload.storage.backends import make_s3_filesystem  # noqa: E402
from fastload.storage.url import resolve_s3  # noqa: E402


def measure(cases: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict[str, Any]]:
    """Warm every case up once, then time them round-robin ``repeats`` times (so a
    change in machine load hits every case alike), the order rotated every round and
    dirty pages flushed before each timing (a case that writes must not slow the next
    one's writes). Each case returns bytes moved."""
    for fn in cases.values():
        fn()
    rates: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            os.sync()
            t0 = time.perf_counter()
            n = cases[name]()
            rates[name].append(n / (time.perf_counter() - t0) / 1e6)
    return {
        name: {
            "median_MBps": statistics.median(r),
            "min_MBps": min(r),
            "max_MBps": max(r),
            "runs_MBps": r,
        }
        for name, r in rates.items()
    }


def paired_ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median over rounds of a's rate / b's rate in the same round: robust to load that
    drifts between rounds (each round times every case back to back)."""
    return statistics.median(x / y for x, y in zip(a["runs_MBps"], b["runs_MBps"], strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="s3:// or cos:// prefix to use (needs write)")
    parser.add_argument("--seaweed", action="store_true", help="start a local SeaweedFS")
    parser.add_argument("--storage-options", default="{}", help="JSON storage options")
    parser.add_argument("--size", default="256MB", help="object size (default 256MB)")
    parser.add_argument("--threads", type=int, default=16, help="parallel GETs (default 16)")
    parser.add_argument("--part-size", default="16MiB", help="ranged GET size (default 16MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs each (default 5)")
    parser.add_argument("--dest-dir", help="where downloads are written (default: a temp dir)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if bool(args.url) == bool(args.seaweed):
        parser.error("give either a URL or --seaweed")

    server = None
    if args.seaweed:
        server = LocalS3().start()
        url = server.new_url("bench")
        options: dict[str, Any] = server.storage_options
    else:
        url, options = args.url, json.loads(args.storage_options)
    size = parse_size(args.size)
    part = parse_size(args.part_size)
    try:
        results = run(url, options, size, part, args.threads, args.repeats, args.dest_dir)
    finally:
        if server is not None:
            server.stop()
    results["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    print(f"\n$ {results['command']}")
    print(f"{'case':42s} {'median':>8s}  {'min':>7s} {'max':>7s}  x ceiling  x bound")
    for name, r in results["cases"].items():
        print(
            f"{name:42s} {r['median_MBps']:8.1f}  {r['min_MBps']:7.1f} {r['max_MBps']:7.1f}"
            f"  {results['ratios_to_ceiling'][name]:9.2f}  {results['ratios_to_bound'][name]:7.2f}"
        )
    print("(MB/s; ratios are medians of per-round ratios; ceiling: GETs, nothing written;")
    print(" bound: the same GETs pwritten to a file from the event loop)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def run(
    url: str,
    options: dict[str, Any],
    size: int,
    part: int,
    threads: int,
    repeats: int,
    dest_dir: str | None = None,
) -> dict[str, Any]:
    """Upload one object of ``size`` bytes below ``url`` and time every reader on it."""
    store = open_store(url, options)
    data = os.urandom(size)
    with store.open_write("big.bin") as f:
        f.write(data)
    del data
    settings = resolve_s3(store.url("big.bin"), options)
    key = f"{settings.bucket}/{settings.prefix}"
    fs = make_s3_filesystem(settings, FetchConfig().retry, pool=max(64, 2 * threads))
    ranges = [(s, min(s + part, size)) for s in range(0, size, part)]

    def ceiling_gather() -> int:
        async def go() -> int:
            sem = asyncio.Semaphore(threads)

            async def one(start: int, end: int) -> int:
                async with sem:
                    return len(await fs._cat_file(key, start=start, end=end))

            return sum(await asyncio.gather(*(one(s, e) for s, e in ranges)))

        from fsspec.asyn import sync

        return int(sync(fs.loop, go))

    bucket, _, obj_key = key.partition("/")
    tmp = tempfile.mkdtemp(prefix="fastload-bench-", dir=dest_dir)
    dest = os.path.join(tmp, "big.bin")

    jobs = [(obj_key, s, e) for s, e in ranges]

    def ceiling_raw() -> int:
        # Ranged GETs on the raw aiobotocore client, bodies read in 1 MiB pieces and
        # dropped: nothing is copied, joined or written.
        async def go() -> int:
            return await ranged_gets(await fs.set_session(), bucket, jobs, threads)

        from fsspec.asyn import sync

        return int(sync(fs.loop, go))

    def ceiling_raw_written() -> int:
        # The same GETs, each piece pwritten at its offset from the event loop: what a
        # download costs with no retry bookkeeping and no thread hops.
        async def go(fd: int) -> int:
            def write(_key: str, chunk: bytes, pos: int) -> None:
                os.pwrite(fd, chunk, pos)

            return await ranged_gets(await fs.set_session(), bucket, jobs, threads, write)

        from fsspec.asyn import sync

        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            return int(sync(fs.loop, go, fd))
        finally:
            os.close(fd)
            os.unlink(dest)

    pool = ThreadPoolExecutor(threads)

    def ceiling_threads() -> int:
        return sum(pool.map(lambda r: len(fs.cat_file(key, start=r[0], end=r[1])), ranges))

    default_store = open_store(url, options)
    tuned = FetchConfig(part_size=part, concurrency=threads, parallel_threshold=part)
    tuned_store = open_store(url, options, fetch=tuned)

    def download(s: Any) -> Callable[[], int]:
        def fn() -> int:
            n = int(s.download("big.bin", dest, expected_size=size))
            os.unlink(dest)
            return n

        return fn

    def s3fs_cat() -> int:
        return len(fs.cat_file(key))

    cases = measure(
        {
            f"ceiling: {threads} raw ranged GETs, dropped": ceiling_raw,
            f"ceiling: gather {threads} s3fs _cat_file": ceiling_gather,
            f"ceiling: {threads} threads s3fs cat_file": ceiling_threads,
            f"bound: {threads} raw GETs pwritten to file": ceiling_raw_written,
            "ObjectStore.download (default config)": download(default_store),
            f"ObjectStore.download (concurrency {threads})": download(tuned_store),
            "s3fs cat_file (one GET)": s3fs_cat,
        },
        repeats,
    )
    pool.shutdown()
    os.rmdir(tmp)
    ceiling_name = max(
        (k for k in cases if k.startswith("ceiling")), key=lambda k: cases[k]["median_MBps"]
    )
    bound_name = next(k for k in cases if k.startswith("bound"))
    ceiling = cases[ceiling_name]["median_MBps"]
    import aiobotocore
    import fsspec
    import s3fs

    return {
        "version": 1,
        "object_bytes": size,
        "part_bytes": part,
        "threads": threads,
        "repeats": repeats,
        "dest_dir": os.path.dirname(tmp),
        "ceiling_MBps": ceiling,
        "cases": cases,
        "ceiling_case": ceiling_name,
        "bound_case": bound_name,
        "ratios_to_ceiling": {k: paired_ratio(v, cases[ceiling_name]) for k, v in cases.items()},
        "ratios_to_bound": {k: paired_ratio(v, cases[bound_name]) for k, v in cases.items()},
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "s3fs": s3fs.__version__,
            "fsspec": fsspec.__version__,
            "aiobotocore": aiobotocore.__version__,
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
