"""Crop benchmark: ``fastload.decode.decode_crop`` vs Pillow's full decode then crop.

Random 512x512 crops of large photo-like JPEGs (4096x4096 and 2048x1024, quality 90,
4:2:0, no restart markers; ``fastload.convert.synthetic.photo_like``), one thread:

- ``pillow_full_crop``  the baseline: ``Image.open(...).convert("RGB")``, then
  ``.crop(box)`` to a NumPy array (the whole image is decoded);
- ``decode_crop``       ``decode_crop(data, box)`` with the decoder this build has
  (native: libjpeg-turbo decodes only the crop's columns and the rows down to its
  bottom);
- ``decode_crop_pillow`` the same call with ``decoder="pillow"`` (the fallback).

The same boxes (seeded) for every method; each method gets a warm-up and
``--repeats`` timed passes, interleaved; crops/s is per CPU second of the decoding
thread (robust on a shared machine), as the median and spread (min, max), with
speed-ups over the baseline. Equality: max and mean absolute difference between
``decode_crop`` and the baseline over every crop.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_crop.py [--json] [--crops N]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from fastload.convert.synthetic import photo_like
from fastload.decode import backend_info, crop_decoder, decode_crop

SCHEMA = "fastload.bench_crop/1"
SIZES = ((4096, 4096), (2048, 1024))  # (width, height)
CROP = 512


def make_jpeg(width: int, height: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(width, height, seed=seed)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def boxes(width: int, height: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    return [
        (
            int(rng.integers(0, width - CROP + 1)),
            int(rng.integers(0, height - CROP + 1)),
            CROP,
            CROP,
        )
        for _ in range(count)
    ]


def pillow_full_crop(data: bytes, box: tuple[int, int, int, int]) -> np.ndarray:
    left, top, w, h = box
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return np.array(img.crop((left, top, left + w, top + h)))


METHODS: dict[str, Callable[[bytes, tuple[int, int, int, int]], np.ndarray]] = {
    "pillow_full_crop": pillow_full_crop,
    "decode_crop": lambda data, box: decode_crop(data, box),
    "decode_crop_pillow": lambda data, box: decode_crop(data, box, decoder="pillow"),
}


def timed_pass(fn: Callable[..., np.ndarray], data: bytes, bxs: list[Any]) -> tuple[float, float]:
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for box in bxs:
        fn(data, box)
    return time.thread_time() - cpu0, time.perf_counter() - wall0


def run_size(width: int, height: int, crops: int, repeats: int) -> dict[str, Any]:
    data = make_jpeg(width, height, seed=width + height)
    bxs = boxes(width, height, crops, seed=width * 7 + height)
    diffs = [np.abs(decode_crop(data, b).astype(np.int16) - pillow_full_crop(data, b)) for b in bxs]
    cpu: dict[str, list[float]] = {m: [] for m in METHODS}
    wall: dict[str, list[float]] = {m: [] for m in METHODS}
    for fn in METHODS.values():
        timed_pass(fn, data, bxs[:2])  # warm-up
    for _ in range(repeats):
        for m, fn in METHODS.items():
            c, w = timed_pass(fn, data, bxs)
            cpu[m].append(crops / c)
            wall[m].append(crops / w)
    base = statistics.median(cpu["pillow_full_crop"])
    return {
        "image": f"{width}x{height}",
        "jpeg_bytes": len(data),
        "crops": crops,
        "max_abs_diff": int(max(int(d.max()) for d in diffs)),
        "mean_abs_diff": float(np.mean([d.mean() for d in diffs])),
        "methods": {
            m: {
                "crops_per_cpu_s": statistics.median(cpu[m]),
                "spread": [min(cpu[m]), max(cpu[m])],
                "crops_per_wall_s": statistics.median(wall[m]),
                "speedup": statistics.median(cpu[m]) / base,
            }
            for m in METHODS
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crops", type=int, default=40, help="random crops per image size")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per method")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    report = {
        "schema": SCHEMA,
        "decoder": crop_decoder(),
        "backend": backend_info(),
        "python": platform.python_version(),
        "results": [run_size(w, h, args.crops, args.repeats) for w, h in SIZES],
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"decoder: {report['decoder']}; {report['backend']['library']} "
        f"{report['backend']['version']}"
    )
    for r in report["results"]:
        print(
            f"{r['image']} ({r['jpeg_bytes'] / 1e6:.1f} MB JPEG), {r['crops']} crops of "
            f"{CROP}x{CROP}: max diff {r['max_abs_diff']}, mean {r['mean_abs_diff']:.3f}"
        )
        for m, s in r["methods"].items():
            print(
                f"  {m:20s} {s['crops_per_cpu_s']:8.1f} crops/CPU-s "
                f"({s['spread'][0]:.1f}-{s['spread'][1]:.1f})  x{s['speedup']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
