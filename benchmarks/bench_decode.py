"""Decode benchmark: JPEG draft-mode decode + resize vs plain Pillow, in the same run.

COCO-sized JPEGs (640x480, quality 90, ~155 KB of photo-like content with noise) are
decoded on one thread (so img/s is per core) by:

- ``plain_resize``  the torchvision way, the baseline: ``Image.open(...).convert("RGB")``
  then ``.resize((224, 224), BILINEAR)``;
- ``draft_resize``  ``fastload.decode.decode_image(size=(224, 224), resize="exact")``:
  libjpeg decodes at 1/2 scale (DCT scaling), then the same resize;
- ``plain_decode``  full decode only, no resize;
- ``draft_decode``  the reduced decode only (``Image.draft`` towards 224x224);
- ``native_decode`` the same reduced decode by fastload's native libjpeg-turbo decoder
  (where built), the pixels checked equal to ``draft_decode``'s;
- ``loader_work``   what the loader does per image with ``decode="tensor", size=224``
  (draft decode, torch's resize, tensor; where torch is installed): one core's rate
  of the work the decode epoch's bound is made of. Its JPEGs go through the native
  decoder where built (``fastload.decode.image``'s native path);
- ``loader_work_pillow`` the same with ``FASTLOAD_CROP_DECODER=pillow`` (Pillow's
  draft decode, as before the native path), the tensors checked byte-equal to
  ``loader_work``'s (``loader_work_max_diff``).

Each method gets a warm-up pass and ``--repeats`` timed passes over all images,
interleaved with the other methods; img/s is per CPU second of the decoding thread
(robust when other processes share the machine; wall-clock img/s is reported too),
as the median and spread (min, max), with speed-ups over the plain baseline.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_decode.py [--json] [--images N]
    benchmarks/bench_decode.py --compare pillow.json simd.json   # side by side

Runs with only numpy and Pillow (or Pillow-SIMD) installed, so the same script
measures a second environment (see ``benchmarks/pillow_simd.sh``). ``--cache DIR``
keeps the generated JPEGs so that two environments decode byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from PIL import Image

from fastload.config import MAX_IMAGE_PIXELS
from fastload.convert.synthetic import photo_like  # the decode tests' images too
from fastload.decode import (
    backend_info,
    crop_scale,
    decode_image,
    decode_tensor,
    image_size,
    open_image,
)
from fastload.decode._deps import NATIVE_DECODER_ENV

SCHEMA = "fastload.bench_decode/1"
SIZE = (224, 224)


def make_images(count: int, cache: Path | None) -> list[bytes]:
    """Return ``count`` JPEGs, from ``cache`` if it has them (else generated, then saved)."""
    if cache is not None:
        files = sorted(cache.glob("img-*.jpg"))
        if len(files) >= count:
            return [f.read_bytes() for f in files[:count]]
    images = []
    for i in range(count):
        buf = io.BytesIO()
        Image.fromarray(photo_like(640, 480, seed=i)).save(buf, "JPEG", quality=90)
        images.append(buf.getvalue())
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(images):
            (cache / f"img-{i:04d}.jpg").write_bytes(data)
    return images


def plain_resize(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB").resize(SIZE, Image.Resampling.BILINEAR)


def draft_resize(data: bytes) -> Image.Image:
    return decode_image(data, size=SIZE, resize="exact")


def plain_decode(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def draft_decode(data: bytes) -> Image.Image:
    return open_image(data, draft_size=SIZE)[0]


def _native_region() -> Callable[..., Any] | None:
    try:
        from fastload._native import decode_jpeg_region
    except ImportError:  # the extension is not built (or built without libjpeg-turbo)
        return None
    return cast("Callable[..., Any]", decode_jpeg_region)


def native_decode(data: bytes) -> Any:
    """The native libjpeg-turbo decoder (``fastload._native.decode_jpeg_region``, the
    GIL released) on the whole image at the scale ``draft_decode`` picks: the same
    pixels (checked, see ``native_max_diff``)."""
    width, height = image_size(data)
    denom = crop_scale(width, height, SIZE)
    scaled = (-(-width // denom), -(-height // denom))
    region = _native_region()
    assert region is not None
    return region(data, 0, 0, scaled[0], scaled[1], denom, False, MAX_IMAGE_PIXELS)


def loader_work(data: bytes) -> Any:
    """What the loader's decode does per image (``decode="tensor", size=224``): draft
    decode, torch's resize, a uint8 tensor (needs torch; torch at one thread)."""
    return decode_tensor(data, size=SIZE, resize="exact")


def loader_work_pillow(data: bytes) -> Any:
    """:func:`loader_work` through Pillow's draft decode (the native path switched off)."""
    saved = os.environ.get(NATIVE_DECODER_ENV)
    os.environ[NATIVE_DECODER_ENV] = "pillow"
    try:
        return decode_tensor(data, size=SIZE, resize="exact")
    finally:
        if saved is None:
            del os.environ[NATIVE_DECODER_ENV]
        else:
            os.environ[NATIVE_DECODER_ENV] = saved


METHODS: dict[str, Callable[[bytes], Any]] = {
    "plain_resize": plain_resize,
    "draft_resize": draft_resize,
    "plain_decode": plain_decode,
    "draft_decode": draft_decode,
}
BASELINES = {"draft_resize": "plain_resize", "draft_decode": "plain_decode"}
if _native_region() is not None:
    METHODS["native_decode"] = native_decode
    BASELINES["native_decode"] = "draft_decode"
try:
    import torch

    torch.set_num_threads(1)
    METHODS["loader_work"] = loader_work
    BASELINES["loader_work"] = "plain_resize"
    METHODS["loader_work_pillow"] = loader_work_pillow
    BASELINES["loader_work_pillow"] = "plain_resize"
except ImportError:  # Pillow-only environments (benchmarks/pillow_simd.sh)
    pass


def native_max_diff(images: list[bytes]) -> int | None:
    """Largest difference of a pixel level between ``native_decode`` and Pillow's
    draft decode of the same images (None without the native decoder)."""
    if "native_decode" not in METHODS:
        return None
    worst = 0
    for data in images:
        a = np.asarray(native_decode(data), dtype=np.int16)
        b = np.asarray(draft_decode(data).convert("RGB"), dtype=np.int16)
        worst = max(worst, int(np.abs(a - b).max()) if a.shape == b.shape else 255)
    return worst


def loader_work_max_diff(images: list[bytes]) -> int | None:
    """Largest difference of a pixel level between ``loader_work`` (native path) and
    ``loader_work_pillow`` on the same images (None without torch)."""
    if "loader_work" not in METHODS:
        return None
    worst = 0
    for data in images:
        a, b = loader_work(data).int(), loader_work_pillow(data).int()
        worst = max(worst, int((a - b).abs().max()) if a.shape == b.shape else 255)
    return worst


def measure(
    fn: Callable[[bytes], Any], images: list[bytes], repeats: int
) -> list[tuple[float, float]]:
    """``(img/s per CPU second, img/s per wall second)`` of each of ``repeats`` passes,
    after one warm-up pass. CPU time is the per-core figure and is robust to other
    processes sharing the machine; wall time is reported beside it."""
    for data in images:
        fn(data)
    rates = []
    for _ in range(repeats):
        cpu, wall = time.thread_time(), time.perf_counter()
        for data in images:
            fn(data)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        rates.append((len(images) / cpu, len(images) / wall))
    return rates


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    images = make_images(args.images, args.cache)
    digest = hashlib.sha256(b"".join(images)).hexdigest()[:16]
    results: dict[str, Any] = {}
    # Interleave the methods round by round, so drift (thermal, noisy neighbours)
    # hits baseline and candidate alike.
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    for _ in range(args.repeats):
        for name, fn in METHODS.items():
            rates[name] += measure(fn, images, 1)
    for name, values in rates.items():
        cpu = [v[0] for v in values]
        wall = [v[1] for v in values]
        results[name] = {
            "img_per_s": statistics.median(cpu),
            "min": min(cpu),
            "max": max(cpu),
            "wall_img_per_s": statistics.median(wall),
            "runs": len(values),
        }
    for name, base in BASELINES.items():
        results[name]["speedup_vs"] = base
        results[name]["speedup"] = results[name]["img_per_s"] / results[base]["img_per_s"]
    return {
        "schema": SCHEMA,
        "command": " ".join([sys.executable, *sys.argv]),
        "images": len(images),
        "image_size": [640, 480],
        "mean_jpeg_bytes": sum(map(len, images)) / len(images),
        "inputs_sha256": digest,
        "output_size": list(SIZE),
        "threads": 1,
        "repeats": args.repeats,
        "backend": backend_info(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "results": results,
        "native_max_diff": native_max_diff(images),
        "loader_work_max_diff": loader_work_max_diff(images),
    }


def print_table(doc: dict[str, Any]) -> None:
    b = doc["backend"]
    print(
        f"{b['library']} {b['version']} (libjpeg-turbo {b.get('libjpeg_turbo_version')}), "
        f"{doc['images']} JPEGs 640x480 ~{doc['mean_jpeg_bytes'] / 1000:.0f} KB, one thread, "
        f"{doc['cpu']}; img/s per CPU second (median, min, max of {doc['repeats']}) and wall"
    )
    print(f"{'method':<18} {'img/s':>8} {'min':>8} {'max':>8} {'wall':>8}  speed-up")
    for name, r in doc["results"].items():
        ratio = f"{r['speedup']:.2f}x vs {r['speedup_vs']}" if "speedup" in r else "baseline"
        print(
            f"{name:<18} {r['img_per_s']:8.1f} {r['min']:8.1f} {r['max']:8.1f} "
            f"{r['wall_img_per_s']:8.1f}  {ratio}"
        )
    if doc.get("loader_work_max_diff") is not None:
        print(f"loader_work against loader_work_pillow: max |diff| {doc['loader_work_max_diff']}")
    if doc.get("native_max_diff") is not None:
        print(f"native_decode against Pillow's draft decode: max |diff| {doc['native_max_diff']}")


def compare(paths: list[str]) -> None:
    """Print several result files side by side, with ratios to the first."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len({d["inputs_sha256"] for d in docs}) != 1:
        print("warning: the runs decoded different inputs", file=sys.stderr)
    names = [f"{d['backend']['library']} {d['backend']['version']}" for d in docs]
    header = f"{'img/s/core':<14}" + "".join(f"{n:>26}" for n in names)
    print(header + "".join(f"{'ratio ' + str(i + 2) + '/1':>12}" for i in range(len(docs) - 1)))
    for method in docs[0]["results"]:
        values = [d["results"][method]["img_per_s"] for d in docs]
        row = f"{method:<14}" + "".join(f"{v:26.1f}" for v in values)
        row += "".join(f"{v / values[0]:11.2f}x" for v in values[1:])
        print(row)
    for d, n in zip(docs, names, strict=True):
        speed = ", ".join(
            f"{m} {r['speedup']:.2f}x" for m, r in d["results"].items() if "speedup" in r
        )
        print(f"draft speed-up within {n}: {speed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--images", type=int, default=64, help="number of distinct JPEGs")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per method")
    parser.add_argument("--cache", type=Path, default=None, help="keep/reuse the JPEGs here")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument("--compare", nargs="+", metavar="JSON", help="compare result files")
    args = parser.parse_args(argv)
    if args.compare:
        compare(args.compare)
        return 0
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
