"""Section ``rss``: the peak RSS of each worker when the data set grows 10x (random
payloads, a warm ``cache_dir``, one raw epoch per size and variant in a fresh
process that reads its workers' ``/proc/<pid>/status`` after every batch)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastload
from _epoch_common import batch_images
from transport.data import Ctx

RSS_PAYLOAD = 139_000  # bytes per random sample in the rss section
#: the script whose ``--rss-child`` runs :func:`rss_child` in a fresh process
SCRIPT = Path(__file__).resolve().parents[1] / "bench_transport.py"


def write_random_shards(root: Path, n: int, shard_size: str) -> str:
    """``n`` samples of :data:`RSS_PAYLOAD` random bytes (field ``bin``) as shards
    under ``root`` (kept if already there); returns the URL."""
    url = str(root)
    if (root / "manifest.json").is_file() and fastload.Manifest.load(url).num_samples == n:
        return url
    rng = np.random.default_rng(n)
    with fastload.ShardWriter(url, shard_size=shard_size, overwrite=True) as w:
        for i in range(n):
            w.write({"__key__": f"{i:08d}", "bin": rng.bytes(RSS_PAYLOAD)})
    return url


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of ``pid`` in bytes ({} if gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def note_worker(pid_dir: str, worker_id: int) -> None:
    """``worker_init_fn``: leave this worker's pid where the main process looks."""
    Path(pid_dir, f"{worker_id}-{os.getpid()}").touch()


def read_workers(pid_dir: str, peak: dict[int, dict[str, int]]) -> None:
    """Fold the memory of each worker noted in ``pid_dir`` into its ``peak``."""
    for name in os.listdir(pid_dir):
        pid = int(name.split("-")[1])
        st = proc_status(pid)
        if st:
            mine = peak.setdefault(pid, {})
            for k, v in st.items():
                mine[k] = max(mine.get(k, 0), v)


def rss_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One raw epoch (in this fresh process) reading the workers' memory after every
    batch; returns their peaks and this process's."""
    pid_dir = tempfile.mkdtemp(prefix="fl-rss-pids-")
    url, cache = spec["url"], spec["cache"]
    if spec["kind"] == "sharded":
        ds: Any = fastload.ShardedDataset(url, cache_dir=cache)
        kw: dict[str, Any] = {"shuffle": True}
    else:
        ds = fastload.StreamingDataset(url, shuffle=True, cache_dir=cache)
        kw = {}
    loader = fastload.DataLoader(
        ds,
        batch_size=spec["batch_size"],
        num_workers=spec["workers"],
        transport=spec["transport"],
        plan_in_workers=True,  # measure worker processes (raw batches start none else)
        worker_init_fn=functools.partial(note_worker, pid_dir),
        # kept alive to the end of the epoch, so that each worker is read at least once
        # (a worker that started after the last batch, or ended its share early, was
        # missed on a loaded machine: "saw 1 workers")
        persistent_workers=True,
        **kw,
    )
    before = proc_status(os.getpid())
    peak: dict[int, dict[str, int]] = {}
    keys: set[str] = set()
    delivered = 0
    t0 = time.perf_counter()
    for batch in loader:
        delivered += batch_images(batch)
        keys.update(batch["__key__"])
        read_workers(pid_dir, peak)
    wall = time.perf_counter() - t0
    # every worker once more (VmHWM is its peak so far), waiting for one whose start
    # the epoch did not wait for
    deadline = time.monotonic() + 60.0
    while len(os.listdir(pid_dir)) < spec["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    read_workers(pid_dir, peak)
    transport = loader.transport
    loader.close()
    ds.close()
    shutil.rmtree(pid_dir, ignore_errors=True)
    return {
        "delivered": delivered,
        "unique_keys": len(keys),
        "wall_s": wall,
        "transport": transport,
        "main_rss_before": before.get("VmRSS", 0),
        "main_peak": proc_status(os.getpid()).get("VmHWM", 0),
        "main_end": proc_status(os.getpid()),
        "workers": [peak[p] for p in sorted(peak)],
    }


def section_rss(ctx: Ctx) -> dict[str, Any]:
    """Each variant's worker peak RSS at ``--rss-samples`` and 10x that (a fresh
    process each); the goal lines (flat within 10%)."""
    args = ctx.args
    sizes = (args.rss_samples, 10 * args.rss_samples)
    data: dict[int, tuple[str, str]] = {}
    for n in sizes:
        t0 = time.perf_counter()
        url = write_random_shards(ctx.work / f"rss-{n}" / "shards", n, args.shard_size)
        cache = str(ctx.work / f"rss-{n}" / "cache")
        ds = fastload.ShardedDataset(url, cache_dir=cache)
        for s in range(len(ds.manifest.shards)):  # warm the cache (in this process)
            ds.source.index(s)
            ds.source.shard(s)
        ds.close()
        data[n] = (url, cache)
        print(f"  rss data {n} samples ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    variants = [("fl_sharded", "sharded", "auto"), ("fl_stream", "stream", "auto")]
    variants.append(("fl_sharded_pickle", "sharded", "pickle"))
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for name, kind, transport in variants:
        for n in sizes:
            url, cache = data[n]
            spec = {
                "url": url,
                "cache": cache,
                "kind": kind,
                "transport": transport,
                "workers": ctx.nw,
                "batch_size": ctx.bs,
            }
            proc = subprocess.run(
                [sys.executable, str(SCRIPT), "--rss-child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"rss child {name} {n} failed:\n{proc.stderr[-4000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            pad = ctx.bs * ctx.nw if kind == "stream" else 1
            if r["unique_keys"] != n or not n <= r["delivered"] < n + pad:
                raise AssertionError(f"rss {name} {n}: {r['unique_keys']} keys, {r['delivered']}")
            if len(r["workers"]) != ctx.nw:
                raise AssertionError(f"rss {name} {n}: saw {len(r['workers'])} workers")
            r["worker_peak_max"] = max(w["VmHWM"] for w in r["workers"])
            runs.setdefault(name, {})[n] = r
            print(
                f"  rss {name:<18} {n:>7} samples: worker peak "
                f"{r['worker_peak_max'] / 2**20:7.1f} MiB, main peak "
                f"{r['main_peak'] / 2**20:7.1f} MiB ({r['wall_s']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    lo, hi = sizes
    rows = {}
    for name, per in runs.items():
        ratio = per[hi]["worker_peak_max"] / per[lo]["worker_peak_max"]
        rows[name] = {"small": per[lo], "large": per[hi], "ratio": ratio}
    goals = [
        {
            "ratio": f"{name} worker peak RSS {hi}/{lo}",
            "need": "0.9..1.1",
            "paired": rows[name]["ratio"],
            "wall": rows[name]["ratio"],
            "met": 0.9 <= rows[name]["ratio"] <= 1.1,
        }
        for name in ("fl_sharded", "fl_stream")
    ]
    return {"sizes": list(sizes), "payload_bytes": RSS_PAYLOAD, "runs": rows, "goals": goals}
