"""Conversion throughput of ``fastload.convert.coco`` against a baseline in the same run.

The baseline is the obvious hand-written converter: one thread reads each image and
writes it with its annotations through ``webdataset.TarWriter`` (no decoding check,
no index, no manifest). fastload is timed with and without full-decode
verification and with 1 and several reader threads. Each variant runs ``--repeats``
times on the same synthetic COCO set (page cache warm after the first, untimed,
pass); the median and spread are printed, with ratios to the baseline, and written
as JSON with ``--json``.

With ``--ray`` the same conversion also runs with ``executor="ray"`` on a local Ray
runtime of ``--ray-cpus`` CPUs (started once; its start-up time is printed apart),
verify on, against the local converter with the same threads in the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_convert.py --images 300 --repeats 3
    PYTHONPATH=src .venv/bin/python benchmarks/bench_convert.py --images 300 --ray
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


def baseline(images: str, ann: str, out: str) -> None:
    """Single-threaded webdataset.TarWriter converter: read bytes, write tar."""
    import webdataset as wds

    with open(ann, "rb") as f:
        doc = json.load(f)
    anns: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in doc["annotations"]:
        anns[a["image_id"]].append(a)
    by_id = {img["id"]: img for img in doc["images"]}
    os.makedirs(out, exist_ok=True)
    with wds.TarWriter(os.path.join(out, "shard-000000.tar")) as sink:
        for image_id in sorted(by_id):
            img = by_id[image_id]
            with open(os.path.join(images, img["file_name"]), "rb") as f:
                data = f.read()
            sink.write(
                {
                    "__key__": f"{image_id:012d}",
                    "jpg": data,
                    "json": {"image": img, "annotations": anns[image_id]},
                }
            )


def fastload_variant(
    images: str, ann: str, out: str, verify: bool, workers: int, executor: str = "local"
) -> Callable[[], None]:
    from fastload import convert

    def run() -> None:
        convert.coco(
            images, ann, out, workers=workers, verify=verify, progress=False, executor=executor
        )

    return run


def timed(fn: Callable[[], None], out: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", default="640x480", help="largest image, WxH")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="threads of the parallel runs")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    parser.add_argument("--ray", action="store_true", help="also convert with executor='ray'")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray runtime")
    args = parser.parse_args()

    from fastload import __version__
    from fastload.convert.synthetic import make_coco

    w, h = (int(v) for v in args.size.split("x"))
    tmp = tempfile.mkdtemp(prefix="fastload-bench-convert-")
    try:
        images, ann = make_coco(os.path.join(tmp, "src"), num_images=args.images, size=(w, h))
        src_bytes = sum(e.stat().st_size for e in os.scandir(images))
        out = os.path.join(tmp, "out")
        variants: dict[str, Callable[[], None]] = {
            "baseline webdataset.TarWriter, 1 thread": lambda: baseline(images, ann, out),
        }
        for verify in (False, True):
            for workers in (1, args.workers):
                name = f"fastload verify={verify} workers={workers}"
                variants[name] = fastload_variant(images, ann, out, verify, workers)
        ray_start_s = None
        if args.ray:
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
            ray_start_s = time.perf_counter() - t0
            print(f"local Ray runtime ({args.ray_cpus} CPUs) started in {ray_start_s:.1f} s")
            name = f"fastload verify=True workers={args.workers} executor=ray"
            variants[name] = fastload_variant(images, ann, out, True, args.workers, "ray")
        for fn in variants.values():  # warm the page cache and imports
            timed(fn, out, 1)
        results = []
        base_median = None
        print(f"{args.images} images, {src_bytes / 1e6:.1f} MB of JPEG, {os.cpu_count()} CPUs")
        print(f"{'variant':45s} {'median s':>9s} {'spread s':>9s} {'MB/s':>8s} {'vs base':>8s}")
        for name, fn in variants.items():
            times = timed(fn, out, args.repeats)
            med = statistics.median(times)
            base_median = base_median or med
            row = {
                "variant": name,
                "median_s": med,
                "min_s": min(times),
                "max_s": max(times),
                "mb_per_s": src_bytes / 1e6 / med,
                "speed_vs_baseline": base_median / med,
            }
            results.append(row)
            print(
                f"{name:45s} {med:9.3f} {max(times) - min(times):9.3f} "
                f"{row['mb_per_s']:8.1f} {row['speed_vs_baseline']:7.2f}x"
            )
        doc = {
            "version": 1,
            "benchmark": "convert.coco",
            "fastload": __version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "images": args.images,
            "size": [w, h],
            "source_bytes": src_bytes,
            "repeats": args.repeats,
            "ray_cpus": args.ray_cpus if args.ray else None,
            "ray_start_s": ray_start_s,
            "results": results,
        }
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
