"""Time to first and last sample of a dataset of many shards, in a fresh process.

A dataset of ``--shards`` shards (default 10,000, a few small samples each) is written
once, to a local SeaweedFS (``fastload.bench.LocalS3``) or with ``--local`` to a
directory. Then, ``--repeats`` times, a fresh Python process (cold: an empty cache
directory each time) runs::

    import fastload                                   # "import"
    ds = fastload.ShardedDataset(url, cache_dir=...)  # "manifest": load and check it
    ds[0]                                             # "first": fetch shard 0, index it
    ds[len(ds) - 1]                                   # "last": the last shard's sample

and reports each step's seconds, measured inside the child from the moment the parent
started it (so the interpreter's own start is in "import"). The goal (issue 27): first
and last sample under 1 s on a quiet machine. ``--profile`` prints the child's 25
costliest functions (cProfile, cumulative) for the manifest and first-fetch steps.

    .venv/bin/python benchmarks/bench_startup.py [--shards 10000] [--repeats 5]
        [--local] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = float(sys.argv[1])
url, cache, opts, profile = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5] == "1"
import fastload
t_import = time.time()
prof = None
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
ds = fastload.ShardedDataset(url, cache_dir=cache, storage_options=opts or None)
t_manifest = time.time()
first = ds[0]
t_first = time.time()
last = ds[len(ds) - 1]
t_last = time.time()
if prof is not None:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
assert first["__key__"] and last["__key__"]
ds.close()
print(json.dumps({"import": t_import - t0, "manifest": t_manifest - t_import,
                  "first": t_first - t_manifest, "last": t_last - t_first,
                  "total": t_last - t0, "samples": len(ds)}))
"""


def write(url: str, shards: int, opts: dict[str, object] | None) -> None:
    from fastload.shards.writer import ShardWriter

    # shard_size below one sample's size: every sample starts a new shard
    with ShardWriter(url, shard_size=64, storage_options=opts) as w:
        for i in range(shards):
            w.write({"__key__": f"s{i:06d}", "bin": i.to_bytes(8, "little") * 16})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--local", action="store_true", help="a local directory, not SeaweedFS")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastload-startup-"))
    server = None
    try:
        opts: dict[str, object] | None = None
        if args.local:
            url = str(work / "ds")
        else:
            from fastload.bench import LocalS3

            server = LocalS3(work / "weed").start()
            url, opts = f"s3://{server.new_bucket()}/ds", server.storage_options
        t = time.time()
        write(url, args.shards, opts)
        print(
            f"wrote {args.shards} shards to {'a directory' if args.local else 'SeaweedFS'}"
            f" in {time.time() - t:.1f} s"
        )
        runs = []
        for r in range(args.repeats):
            cache = work / f"cache{r}"
            t0 = time.time()
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    repr(t0),
                    url,
                    str(cache),
                    json.dumps(opts or {}),
                    "1" if args.profile and r == 0 else "0",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            if args.profile and r == 0:
                print(out.stderr[-6000:])
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            shutil.rmtree(cache, ignore_errors=True)
        load = os.getloadavg()[0]
        print(
            f"{args.shards} shards, {runs[0]['samples']} samples, {args.repeats} fresh processes,"
            f" load average {load:.1f} on {os.cpu_count()} CPUs"
        )
        print(f"{'step':<10} {'median s':>9} {'min s':>7}")
        summary = {}
        for step in ("import", "manifest", "first", "last", "total"):
            vals = [r[step] for r in runs]
            summary[step] = {"median": statistics.median(vals), "min": min(vals)}
            print(f"{step:<10} {statistics.median(vals):9.3f} {min(vals):7.3f}")
        goal = summary["total"]["median"] < 1.0
        print(
            f"first and last sample in {summary['total']['median']:.2f} s (goal < 1 s:"
            f" {'met' if goal else 'missed'})"
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps({"runs": runs, "summary": summary, "load": load}, indent=1)
            )
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
