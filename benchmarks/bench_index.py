"""Index-building benchmark: fastload's C++ scanner vs tarfile vs DALI's wds2idx.

Builds a synthetic WebDataset shard (default 10,000 samples x 2 fields = 20,000
members of a few KB) in a temp dir, then times, in the same run and on the same
page-cached file, building a member/sample index with:

* ``fastload``        ShardIndex.build(path): the file is mmapped and scanned in C++
* ``fastload-bytes``  ShardIndex.build(bytes) on a shard already in RAM (upper bound)
* ``tarfile``         Python's tarfile listing every member with its data offset
* ``wds2idx``         DALI's IndexCreator.create_index() (runs GNU tar twice, as shipped)

Each method gets one warm-up and then ``--repeats`` timed runs; the table shows
wall-clock median, min and spread, the median CPU time (this process plus waited-for
children, so wds2idx's GNU tar processes count), and each method's wall and CPU
medians as multiples of fastload's. On a shared machine trust the CPU column.

usage: python benchmarks/bench_index.py [--samples N] [--repeats R] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def make_shard(path: Path, samples: int, jpg_bytes: int, seed: int = 0) -> int:
    """Write a ustar WebDataset shard; returns its member count."""
    import random

    rng = random.Random(seed)
    members = 0
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for _ in range(samples):
            key = f"{rng.getrandbits(64):016x}"
            for field, size in (("jpg", jpg_bytes + rng.randrange(jpg_bytes)), ("json", 120)):
                data = rng.randbytes(size)
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = size
                info.mtime = 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
                members += 1
    return members


def run_fastload(path: Path) -> int:
    from fastload.shards.index import ShardIndex

    return ShardIndex.build(path).num_members


def run_fastload_bytes(data: bytes) -> int:
    from fastload.shards.index import ShardIndex

    return ShardIndex.build(data).num_members


def run_tarfile(path: Path) -> int:
    with tarfile.open(path, "r:") as tar:
        table = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    return len(table)


def run_wds2idx(path: Path, out: Path) -> int:
    from wds2idx import IndexCreator

    with IndexCreator(str(path), str(out), verbose=False) as creator:
        creator.create_index()
    with open(out) as f:
        return sum(len(line.split()) // 4 for line in list(f)[1:])


def measure(fn: Callable[[], int], repeats: int, expect: int) -> dict[str, float]:
    got = fn()  # warm-up, and a correctness check
    if got != expect:
        raise SystemExit(f"{fn!r} indexed {got} members, expected {expect}")
    times, cpu = [], []
    for _ in range(repeats):
        c0 = _cpu_seconds()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(_cpu_seconds() - c0)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "stdev_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "cpu_median_s": statistics.median(cpu),
        "repeats": repeats,
    }


def _cpu_seconds() -> float:
    """CPU time of this process plus its waited-for children (wds2idx runs GNU tar).

    On a shared machine wall time swings with the load; CPU time shows the work.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def environment() -> dict[str, object]:
    cpu = platform.processor() or "unknown"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    versions: dict[str, str] = {}
    for mod in ("fastload", "numpy", "nvidia.dali"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            versions[mod] = getattr(m, "__version__", "?")
        except ImportError:
            versions[mod] = "missing"
    try:
        tar_version = subprocess.run(
            ["tar", "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        tar_version = "missing"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "tar": tar_version,
        **versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=10_000, help="samples in the shard")
    parser.add_argument("--jpg-bytes", type=int, default=2048, help="min jpg size (up to 2x)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per method (>= 5)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["tarfile", "wds2idx"], help="baselines to skip"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp:
        shard = Path(tmp) / "shard-000000.tar"
        print(f"writing a {args.samples}-sample shard to {shard} ...", file=sys.stderr)
        members = make_shard(shard, args.samples, args.jpg_bytes)
        data = shard.read_bytes()
        methods: dict[str, Callable[[], int]] = {
            "fastload": lambda: run_fastload(shard),
            "fastload-bytes": lambda: run_fastload_bytes(data),
        }
        if "tarfile" not in args.skip:
            methods["tarfile"] = lambda: run_tarfile(shard)
        if "wds2idx" not in args.skip:
            methods["wds2idx"] = lambda: run_wds2idx(shard, Path(tmp) / "wds2idx.idx")
        results = {}
        for name, fn in methods.items():
            print(f"timing {name} ...", file=sys.stderr)
            results[name] = measure(fn, args.repeats, members)

    base = results["fastload"]["median_s"]
    cpu_base = results["fastload"]["cpu_median_s"]
    load = os.getloadavg()[0]
    print(
        f"shard: {members} members, {len(data) / 1e6:.1f} MB, {args.repeats} repeats, "
        f"load average {load:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'method':<16}{'median ms':>11}{'min ms':>10}{'stdev ms':>10}{'cpu ms':>10}"
        f"{'members/s':>12}{'x wall':>9}{'x cpu':>9}"
    )
    for name, r in results.items():
        r["ratio_to_fastload"] = r["median_s"] / base
        r["cpu_ratio_to_fastload"] = r["cpu_median_s"] / cpu_base
        r["members_per_s"] = members / r["median_s"]
        print(
            f"{name:<16}{r['median_s'] * 1e3:>11.1f}{r['min_s'] * 1e3:>10.1f}"
            f"{r['stdev_s'] * 1e3:>10.1f}{r['cpu_median_s'] * 1e3:>10.1f}"
            f"{r['members_per_s']:>12,.0f}{r['ratio_to_fastload']:>8.1f}x"
            f"{r['cpu_ratio_to_fastload']:>8.1f}x"
        )
    doc = {
        "benchmark": "index",
        "version": 1,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "shard": {"members": members, "samples": args.samples, "bytes": len(data)},
        "environment": {**environment(), "load_average_1m": load},
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
