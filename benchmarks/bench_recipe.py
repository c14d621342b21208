"""Detection recipe benchmark: the data side of torchvision's Mask R-CNN reference
(``references/detection``) with ``fastload.CocoDetection`` vs torchvision's own.

Both sides run what ``get_coco(..., "train", use_v2=True, with_masks=True)`` and
``train.py`` do with a dataset: ``wrap_dataset_for_transforms_v2`` (boxes, labels,
image ids, masks), the reference's ``transforms.v2`` training preset (``hflip``),
images without annotations left out, a ``GroupedBatchSampler`` over a seeded
``RandomSampler`` with the reference's aspect-ratio groups (k=3), ``utils.collate_fn``,
``--workers`` worker processes, ``--batch`` images a batch (the recipe pieces are in
``tests/recipes/detection_reference.py`` and ``tests/loader/reference_samplers.py``):

- ``torchvision``  the baseline: ``torchvision.datasets.CocoDetection`` over the
  original JPEGs and annotation file on local disk, through torch's ``DataLoader``;
- ``fastload``     ``fastload.CocoDetection`` over the converted shards with a
  ``cache_dir``, through ``fastload.DataLoader``; the first epoch fills the cache
  (untimed), the timed epochs read from it.

COCO-like data from ``fastload.convert.synthetic.make_coco`` (polygons, crowd RLEs,
images without annotations, landscape and portrait). Epochs are paired (the two
sides alternate, the order flipping each round); images/s is images served over the
epoch's wall time, workers' start included, as the recipe sees it. Reports each
side's median images/s and the median of the per-round ratios fastload/torchvision,
with the load average (the machine may be shared).

    .venv/bin/python benchmarks/bench_recipe.py [--images 300] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from support import torchvision_shim  # noqa: E402

if not torchvision_shim.install():
    raise SystemExit("torchvision does not import: the recipe benchmark needs it")

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.datasets import wrap_dataset_for_transforms_v2  # noqa: E402

import fastload  # noqa: E402
from fastload.convert.synthetic import make_coco  # noqa: E402
from loader.reference_samplers import GroupedBatchSampler  # noqa: E402
from recipes.detection_reference import (  # noqa: E402
    aspect_ratio_groups,
    collate_fn,
    remove_images_without_annotations,
    train_transforms,
)

SCHEMA = "fastload.bench_recipe/1"
KEYS = ["boxes", "labels", "image_id", "masks"]


def train_set(base: Any) -> Any:
    """``get_coco``'s training set over ``base`` (a CocoDetection)."""
    wrapped = wrap_dataset_for_transforms_v2(base, target_keys=KEYS)
    return remove_images_without_annotations(wrapped)


def batch_sampler(dataset: Any, batch: int, seed: int) -> GroupedBatchSampler:
    sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return GroupedBatchSampler(sampler, aspect_ratio_groups(dataset, k=3), batch)


def epoch(make_loader: Any) -> tuple[int, float]:
    """Images served and wall seconds of one epoch of a fresh loader."""
    start = time.perf_counter()
    loader = make_loader()
    images = 0
    for batch_images, _ in loader:
        images += len(batch_images)
    seconds = time.perf_counter() - start
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    return images, seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_recipe_") as tmp:
        images_dir, ann = make_coco(
            Path(tmp) / "src", num_images=args.images, size=tuple(args.size), seed=0
        )
        fastload.convert.coco(images_dir, ann, str(Path(tmp) / "shards"), progress=False)
        t = train_transforms(hflip_prob=0.5)
        with contextlib.redirect_stdout(sys.stderr):  # pycocotools prints while loading
            theirs = train_set(torchvision.datasets.CocoDetection(images_dir, ann, transforms=t))
        ours = train_set(
            fastload.CocoDetection(
                str(Path(tmp) / "shards"), transforms=t, cache_dir=Path(tmp) / "cache"
            )
        )
        assert ours.indices == theirs.indices

        def torch_loader() -> Any:
            return torch.utils.data.DataLoader(
                theirs,
                batch_sampler=batch_sampler(theirs, args.batch, 0),
                num_workers=args.workers,
                collate_fn=collate_fn,
            )

        def fastload_loader() -> Any:
            return fastload.DataLoader(
                ours,
                batch_sampler=batch_sampler(ours, args.batch, 0),
                num_workers=args.workers,
                collate_fn=collate_fn,
            )

        sides = {"torchvision": torch_loader, "fastload": fastload_loader}
        for make in sides.values():
            epoch(make)  # epoch 1: fills fastload's cache, warms the page cache
        rates: dict[str, list[float]] = {name: [] for name in sides}
        served: dict[str, int] = {}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                n, seconds = epoch(sides[name])
                served[name] = n
                rates[name].append(n / seconds)
    assert served["fastload"] == served["torchvision"]
    ratios = [f / t for f, t in zip(rates["fastload"], rates["torchvision"], strict=True)]
    return {
        "schema": SCHEMA,
        "images": args.images,
        "size": list(args.size),
        "served_per_epoch": served["fastload"],
        "batch": args.batch,
        "workers": args.workers,
        "rounds": args.rounds,
        "images_per_s": {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for name, v in rates.items()
        },
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, nargs=2, default=(320, 240), metavar=("W", "H"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['images']} COCO-like images {args.size[0]}x{args.size[1]} "
        f"({result['served_per_epoch']} served an epoch), batch {args.batch}, "
        f"{args.workers} workers, {args.rounds} paired epochs after a warm-up epoch"
    )
    for name, s in result["images_per_s"].items():
        print(f"  {name:12s} {s['median']:8.1f} images/s  (min {s['min']:.1f}, max {s['max']:.1f})")
    print(f"  fastload / torchvision: {result['ratio_median']:.2f}x (median of paired epochs)")
    print(f"  load average {', '.join(f'{x:.2f}' for x in result['load_average'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
