"""Index-building benchmark: fastload's C++ scanner vs tarfile vs DALI's wds2idx.

Builds a synthetic WebDataset shard (default 10,000 samples x 2 fields = 20,000
members of a few KB) in a temp dir, then times, in the same run and on the same
page-cached file, building a member/sample index with:

* ``fastload``        ShardIndex.build(path): the headers are read in ``pread`` windows
                      and scanned in C++ (no mapping, so no SIGBUS if the file shrinks)
* ``fastload-mmap``   ShardIndex.build(mmap): the file mapped and scanned (how
                      ``build(path)`` worked before; kept to show what ``pread`` costs)
* ``fastload-bytes``  ShardIndex.build(bytes) on a shard already in RAM (upper bound)
* ``tarfile``         Python's tarfile listing every member with its data offset
* ``wds2idx``         DALI's IndexCreator.create_index() (runs GNU tar twice, as shipped)

Each method gets one warm-up and then ``--repeats`` timed runs; the table shows
wall-clock median, min and spread, the median CPU time (this process plus waited-for
children, so wds2idx's GNU tar processes count), and each method's wall and CPU
medians as multiples of fastload's. On a shared machine trust the CPU column.

With ``--adopt N`` it measures adopting existing shards instead, in the same run:

* ``fastload manifest`` (``write_manifest``) over N small WebDataset shards written by
  ``webdataset.ShardWriter``: index + checksum + sidecar of each, and the manifest,
  against listing every member of each shard with Python's ``tarfile`` (an index
  only: no checksums, nothing written);
* the same shards gzipped (``.tar.gz``): a first epoch of ``StreamingDataset`` with a
  disk cache (each shard downloaded and decompressed into the cache once) against a
  second epoch (served from the cache), and against a first epoch over the plain tars.

usage: python benchmarks/bench_index.py [--samples N] [--repeats R] [--json OUT]
       python benchmarks/bench_index.py --adopt 1000 [--repeats R] [--json OUT]
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


def run_fastload_mmap(path: Path) -> int:
    import mmap

    from fastload.shards.index import ShardIndex

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        n = ShardIndex.build(mm).num_members
    return n


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
    return timed(fn, repeats, with_stdev=True)


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
    parser.add_argument(
        "--adopt", type=int, default=0, metavar="N", help="measure adopting N existing shards"
    )
    args = parser.parse_args(argv)
    if args.adopt:
        return adopt_main(args)

    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp:
        shard = Path(tmp) / "shard-000000.tar"
        print(f"writing a {args.samples}-sample shard to {shard} ...", file=sys.stderr)
        members = make_shard(shard, args.samples, args.jpg_bytes)
        data = shard.read_bytes()
        methods: dict[str, Callable[[], int]] = {
            "fastload": lambda: run_fastload(shard),
            "fastload-mmap": lambda: run_fastload_mmap(shard),
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


def write_wds_shards(root: Path, n: int, per_shard: int, suffix: str, seed: int = 0) -> int:
    """``n`` shards of ``per_shard`` samples (a ~1-3 KB "jpg" and a "cls") through
    webdataset's ShardWriter; returns the sample count."""
    import random

    import webdataset as wds

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / f"shard-%06d{suffix}"), maxcount=per_shard, verbose=0) as w:
        for i in range(n * per_shard):
            w.write({"__key__": f"s{i:08d}", "jpg": rng.randbytes(1000 + rng.randrange(2000)),
                     "cls": str(i % 10)})  # fmt: skip
    return n * per_shard


def timed(
    fn: Callable[[], object],
    repeats: int,
    before: Callable[[], None] | None = None,
    with_stdev: bool = False,
) -> dict[str, float]:
    """Run ``fn`` ``repeats`` times (``before()`` untimed ahead of each): the median,
    min and max wall seconds (and their standard deviation ``with_stdev``), the median
    CPU seconds and the repeats."""
    times, cpu = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        c0 = _cpu_seconds()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(_cpu_seconds() - c0)
    out = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
    if with_stdev:
        out["stdev_s"] = statistics.stdev(times) if len(times) > 1 else 0.0
    out["cpu_median_s"] = statistics.median(cpu)
    out["repeats"] = repeats
    return out


def adopt_main(args: argparse.Namespace) -> int:
    import shutil

    import fastload

    n, per = args.adopt, 50
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-adopt-") as tmp:
        plain, gz = Path(tmp) / "plain", Path(tmp) / "gz"
        print(f"writing {n} plain and {n} gzipped shards of {per} samples ...", file=sys.stderr)
        samples = write_wds_shards(plain, n, per, ".tar")
        write_wds_shards(gz, n, per, ".tar.gz")
        shards = sorted(plain.glob("*.tar"))
        pattern = str(plain / f"shard-{{000000..{n - 1:06d}}}.tar")

        def tarfile_all() -> None:
            for s in shards:
                run_tarfile(s)

        def clear(root: Path) -> Callable[[], None]:
            def go() -> None:
                for f in root.glob("*.idx"):
                    f.unlink()
                (root / "manifest.json").unlink(missing_ok=True)

            return go

        print("timing fastload manifest / tarfile ...", file=sys.stderr)
        fastload.write_manifest(pattern)  # warm-up: imports, page cache
        tarfile_all()
        for _ in range(2):  # interleaved rounds
            for name, fn, before in (
                ("manifest", lambda: fastload.write_manifest(pattern), clear(plain)),
                ("tarfile", tarfile_all, None),
            ):
                r = timed(fn, max(1, args.repeats // 2), before)
                results.setdefault(name, {"runs": []})["runs"].append(r["median_s"])  # type: ignore[attr-defined]
                results[name].update({k: v for k, v in r.items() if k != "repeats"})
        for name in ("manifest", "tarfile"):
            results[name]["median_s"] = statistics.median(results[name]["runs"])  # type: ignore[arg-type]

        fastload.write_manifest(str(gz))
        clear(plain)()
        fastload.write_manifest(str(plain))
        gz_bytes = sum(p.stat().st_size for p in gz.glob("*.tar.gz"))
        tar_bytes = sum(p.stat().st_size for p in shards)

        def epoch(url: Path, cache: Path) -> Callable[[], None]:
            def go() -> None:
                ds = fastload.StreamingDataset(str(url), cache_dir=str(cache))
                try:
                    got = sum(1 for _ in ds)
                finally:
                    ds.close()
                if got != samples:
                    raise SystemExit(f"epoch read {got} samples, expected {samples}")

            return go

        print("timing gzipped epochs ...", file=sys.stderr)
        cache = Path(tmp) / "cache"
        for k in range(args.repeats):
            c_gz, c_tar = cache / f"gz{k}", cache / f"tar{k}"
            first = timed(epoch(gz, c_gz), 1)
            second = timed(epoch(gz, c_gz), 1)
            plain_first = timed(epoch(plain, c_tar), 1)
            for name, r in (("gz-first", first), ("gz-second", second), ("tar-first", plain_first)):
                results.setdefault(name, {"runs": []})["runs"].append(r["median_s"])  # type: ignore[attr-defined]
            shutil.rmtree(cache)
        for name in ("gz-first", "gz-second", "tar-first"):
            results[name]["median_s"] = statistics.median(results[name]["runs"])  # type: ignore[arg-type]

    load = os.getloadavg()[0]
    m, t = results["manifest"]["median_s"], results["tarfile"]["median_s"]
    g1, g2, t1 = (results[k]["median_s"] for k in ("gz-first", "gz-second", "tar-first"))
    print(
        f"{n} shards x {per} samples ({tar_bytes / 1e6:.1f} MB plain, {gz_bytes / 1e6:.1f} MB "
        f"gzipped), load average {load:.1f} on {os.cpu_count()} cores"
    )
    print(f"fastload manifest (index + checksum + sidecars + manifest): {m:.2f} s")
    print(f"tarfile listing of every shard (index only):               {t:.2f} s  -> {t / m:.1f}x")
    print(f"gzipped, first epoch (decompress into the cache): {g1:.2f} s")
    print(f"gzipped, second epoch (from the cache):           {g2:.2f} s  -> {g1 / g2:.2f}x")
    print(f"plain tar, first epoch:                           {t1:.2f} s  -> {g1 / t1:.2f}x")
    doc = {
        "benchmark": "adopt",
        "version": 1,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "shards": n,
        "samples": samples,
        "bytes": {"plain": tar_bytes, "gzipped": gz_bytes},
        "environment": {**environment(), "load_average_1m": load},
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
