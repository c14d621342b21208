"""The decoded-pixel tier (``pixel_cache=True``): decode epochs to 224x224, one run, ratios.

COCO-sized JPEGs (640x480, ~155 KB, :mod:`_epoch_common`) are written as an image
folder and as fastload shards on local disk. Every variant delivers the same images as
collated ``uint8`` CHW 224x224 tensors with the same ``--workers``, ``--batch-size``
and ``shuffle=True``:

- ``torch_files`` (baseline): ``torch.utils.data.DataLoader`` over a map-style Dataset
  that opens each JPEG file, decodes it with PIL, ``convert("RGB")``,
  ``resize((224, 224), BILINEAR)``, returns a tensor;
- ``cold``: ``fastload.DataLoader`` over ``ShardedDataset(decode="tensor", size=(224,
  224))`` from an empty cache directory (shards fetched from the local store, every
  image decoded in the workers), no tier;
- ``fill``: the same cold epoch with ``pixel_cache=True`` (the tier being filled: the
  epoch goes through the workers);
- ``cold_torch``, ``fill_torch``: the same two epochs through
  ``torch.utils.data.DataLoader`` (what the earlier runs measured);
- ``tier``: the next epoch with ``pixel_cache=True`` through ``fastload.DataLoader``
  (every image in the tier: the batches are built in the loading process, no worker
  process; checked by the loader's counters: ``pixel_hits`` equal to the images,
  nothing built or decoded, ``worker_processes`` 0);
- ``tier_workers``: that epoch through ``torch.utils.data.DataLoader`` with the
  workers (each worker reads the tier; batches cross to the main process in shared
  memory);
- ``tier_inproc``: that epoch through ``torch.utils.data.DataLoader`` with
  ``num_workers=0``.

``cold`` and ``fill`` each start from a fresh empty cache directory (the same cache
state); the ``tier`` variants read the directory their round's ``fill`` left. Rounds
are interleaved with a rotating order; the medians and the ratios ``tier/torch_files``
(target >= 10) and ``fill/cold`` (target >= 0.9) are reported, with the tier's bytes
per image and a byte-for-byte check against a fresh decode of every image of a
``tier`` epoch, batch by batch.

``--case crops``: random-resized crops to 224x224 (torchvision's parameters), every
variant a shuffled epoch of the same images through the same workers:

- ``torch_rrc`` (baseline): each JPEG file opened, decoded with PIL,
  ``convert("RGB")``, then torchvision's ``RandomResizedCrop(224)`` on the PIL image
  and ``pil_to_tensor``;
- ``region``: ``ShardedDataset(decode=CropDecoder(RandomResizedCrop(), size=(224,
  224)))`` over a warm raw cache: each epoch decodes each crop's region (libjpeg-turbo,
  smallest DCT scale that covers 224);
- ``tier_crop``: the same decoder with ``pixel_cache=PixelCache(max_side=--max-side)``,
  an epoch after the one that filled the tier: each crop cut from the stored pixels
  and resized, no JPEG decode (checked: the tier's counters of a pass over every
  image show no decode).

Ratios ``tier_crop/region``, ``tier_crop/torch_rrc`` and ``region/torch_rrc``, and
the same three made item by item in one process (no DataLoader): ms per item.

    PYTHONPATH=tests/support/site .venv/bin/python benchmarks/bench_pixels.py
        [--case tier|crops] [--images 1500] [--repeats 5] [--workers 2]
        [--batch-size 32] [--shard-size 16MB] [--max-side 512] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

import fastload
from _epoch_common import SIZE, Epoch, make_image_folder, time_epoch
from _jpeg_files import JpegFiles
from fastload.cache import DiskTier
from fastload.cache.derived import derived_kind
from fastload.decode import Decoder
from fastload.shards.writer import ShardWriter


def _images(batch: Any) -> Any:
    return batch["jpg"] if isinstance(batch, dict) else batch[0]


def write_shards(paths: list[Path], url: str, shard_size: str) -> Any:
    with ShardWriter(url, shard_size=shard_size) as w:
        for i, p in enumerate(paths):
            w.write({"__key__": f"img{i:06d}", "jpg": p.read_bytes(), "cls": i % 4})
    return w.manifest


def pixel_bytes(cache: Path) -> tuple[int, int]:
    tier = DiskTier(cache, sweep=False)
    try:
        px = [e for e in tier.entries() if derived_kind(e.shard) == "px"]
        return len(px), sum(e.size for e in px)
    finally:
        tier.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pixels-"))
    paths = make_image_folder(work / "folder", args.images)
    url = str(work / "shards")
    if not (work / "shards" / "manifest.json").exists():
        write_shards(paths, url, args.shard_size)
    manifest = fastload.Manifest.from_json((work / "shards" / "manifest.json").read_bytes(), url)

    def loader(ds: Any) -> Any:
        return torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
        )

    seeds = [0]

    def fast_loader(ds: Any) -> fastload.DataLoader:
        seeds[0] += 1  # every epoch its own order
        return fastload.DataLoader(
            ds,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            seed=seeds[0],
        )

    def dataset(cache: Path, pixels: bool) -> Any:
        return fastload.ShardedDataset(
            url, cache_dir=cache, decode="tensor", size=SIZE, pixel_cache=pixels
        )

    counter = [0]

    def fresh_dir() -> Path:
        counter[0] += 1
        d = work / f"cache-{counter[0]}"
        shutil.rmtree(d, ignore_errors=True)
        return d

    filled: list[Path] = []

    def torch_files() -> Epoch:
        return time_epoch(lambda: _count(loader(JpegFiles(paths))))

    def cold() -> Epoch:
        d = fresh_dir()
        e = time_epoch(lambda: _count(fast_loader(dataset(d, False))))
        shutil.rmtree(d, ignore_errors=True)
        return e

    def fill() -> Epoch:
        d = fresh_dir()
        e = time_epoch(lambda: _count(fast_loader(dataset(d, True))))
        filled.append(d)
        return e

    def cold_torch() -> Epoch:
        d = fresh_dir()
        e = time_epoch(lambda: _count(loader(dataset(d, False))))
        shutil.rmtree(d, ignore_errors=True)
        return e

    def fill_torch() -> Epoch:
        d = fresh_dir()
        e = time_epoch(lambda: _count(loader(dataset(d, True))))
        shutil.rmtree(d, ignore_errors=True)
        return e

    def tier() -> Epoch:
        made: list[fastload.DataLoader] = []

        def epoch() -> Any:
            made.append(fast_loader(dataset(filled[-1], True)))
            return _count(made[-1])

        e = time_epoch(epoch)
        io, procs = made[-1].io_stats(), made[-1].worker_processes
        served = (io["pixel_hits"], io["pixel_built"], io["pixel_decoded"], procs)
        if served != (args.images, 0, 0, 0):
            raise AssertionError(f"the tier epoch was not built from the tier here: {served}")
        return e

    def tier_workers() -> Epoch:
        return time_epoch(lambda: _count(loader(dataset(filled[-1], True))))

    def tier_inproc() -> Epoch:
        # the same epoch read in the loading process (no worker): the tier's reads
        # are a copy out of the mapping, so the workers' IPC is most of a batch's cost
        return time_epoch(
            lambda: _count(
                torch.utils.data.DataLoader(
                    dataset(filled[-1], True), batch_size=args.batch_size, shuffle=True
                )
            )
        )

    variants: dict[str, Callable[[], Epoch]] = {
        "torch_files": torch_files,
        "cold": cold,
        "fill": fill,
        "cold_torch": cold_torch,
        "fill_torch": fill_torch,
    }
    later = ("tier", "tier_workers", "tier_inproc")
    results: dict[str, list[Epoch]] = {k: [] for k in [*variants, *later]}
    print("  warm-up torch_files", file=sys.stderr, flush=True)
    torch_files()
    for r in range(args.repeats):
        names = list(variants)
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            print(f"  round {r} {name}", file=sys.stderr, flush=True)
            results[name].append(variants[name]())
        print(f"  round {r} tier", file=sys.stderr, flush=True)
        results["tier"].append(tier())  # the epoch after this round's fill
        results["tier_workers"].append(tier_workers())
        results["tier_inproc"].append(tier_inproc())
        for d in filled[:-1]:
            shutil.rmtree(d, ignore_errors=True)
        del filled[:-1]

    def rate(name: str) -> float:
        return statistics.median(e.samples / e.wall_s for e in results[name])

    summary = {
        name: {
            "samples_per_s": rate(name),
            "samples": [e.samples for e in eps],
            "spread": [
                min(e.samples / e.wall_s for e in eps),
                max(e.samples / e.wall_s for e in eps),
            ],
            # CPU of the loading process and its workers: less noisy than the wall
            # clock on a shared machine
            "cpu_ms_per_sample": statistics.median(1e3 * e.cpu_s / e.samples for e in eps),
        }
        for name, eps in results.items()
    }

    def cpu(name: str) -> float:
        return float(summary[name]["cpu_ms_per_sample"])  # type: ignore[arg-type]

    entries, nbytes = pixel_bytes(filled[-1])
    checked = check_every_image(url, filled[-1])
    doc = {
        "images": args.images,
        "shards": len(manifest.shards),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "results": summary,
        "ratios": {
            "tier/torch_files": rate("tier") / rate("torch_files"),
            "fill/cold": rate("fill") / rate("cold"),
            "fill_torch/cold_torch": rate("fill_torch") / rate("cold_torch"),
            "tier/cold": rate("tier") / rate("cold"),
            "tier_workers/torch_files": rate("tier_workers") / rate("torch_files"),
            "tier_inproc/torch_files": rate("tier_inproc") / rate("torch_files"),
        },
        "cpu_ratios": {
            "cold/fill": cpu("cold") / cpu("fill"),
            "cold_torch/fill_torch": cpu("cold_torch") / cpu("fill_torch"),
            "torch_files/tier": cpu("torch_files") / cpu("tier"),
        },
        "load_average": list(os.getloadavg()),
        "pixel_shards": entries,
        "pixel_bytes": nbytes,
        "pixel_bytes_per_image": nbytes / args.images,
        "tier_inside_cache_dir": str(filled[-1]),
        "checked_equal": checked,
    }
    return doc


class TorchRandomResizedCrop(torch.utils.data.Dataset[tuple[Any, int]]):
    """The crops baseline: item ``i`` opens file ``paths[i]``, decodes it with PIL,
    ``convert("RGB")``, torchvision's ``RandomResizedCrop(224)``, ``pil_to_tensor``."""

    def __init__(self, paths: list[Path]) -> None:
        import torchvision.transforms  # noqa: F401 (imported once, before the workers fork)

        self.paths = [str(p) for p in paths]
        self.crop: Any = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image
        from torchvision.transforms import RandomResizedCrop
        from torchvision.transforms.functional import pil_to_tensor

        if self.crop is None:
            self.crop = RandomResizedCrop(SIZE, antialias=True)
        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        return pil_to_tensor(self.crop(img)), i


def run_crops(args: argparse.Namespace) -> dict[str, Any]:
    """``--case crops`` (see the module docstring)."""
    from fastload.decode import CropDecoder, RandomResizedCrop

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pixels-"))
    paths = make_image_folder(work / "folder", args.images)
    url = str(work / "shards")
    if not (work / "shards" / "manifest.json").exists():
        write_shards(paths, url, args.shard_size)
    cache = work / "cache-crops"
    shutil.rmtree(cache, ignore_errors=True)
    option = fastload.PixelCache(max_side=args.max_side)

    def dataset(pixels: bool) -> Any:
        dec = CropDecoder(RandomResizedCrop(), size=SIZE, seed=0)
        return fastload.ShardedDataset(
            url, cache_dir=cache, decode=dec, pixel_cache=option if pixels else False
        )

    epoch_no = [0]

    def epoch(ds: Any) -> Epoch:
        epoch_no[0] += 1
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch_no[0])  # every epoch its own draws
        loader = torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
        )
        return time_epoch(lambda: _count(loader))

    # warm the raw cache and fill the tier (untimed): the timed epochs are epoch 2+
    print("  warm-up: raw cache, tier fill, torch_rrc", file=sys.stderr, flush=True)
    for _ in _count(torch.utils.data.DataLoader(dataset(True), batch_size=args.batch_size)):
        pass
    epoch(TorchRandomResizedCrop(paths))
    variants: dict[str, Callable[[], Epoch]] = {
        "torch_rrc": lambda: epoch(TorchRandomResizedCrop(paths)),
        "region": lambda: epoch(dataset(False)),
        "tier_crop": lambda: epoch(dataset(True)),
    }
    results: dict[str, list[Epoch]] = {k: [] for k in variants}
    for r in range(args.repeats):
        names = list(variants)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            print(f"  round {r} {name}", file=sys.stderr, flush=True)
            results[name].append(variants[name]())

    def rate(name: str) -> float:
        return statistics.median(e.samples / e.wall_s for e in results[name])

    # one process, no DataLoader: the per-item cost of each variant (interleaved)
    items = min(args.images, 300)
    one: dict[str, list[float]] = {k: [] for k in variants}
    makers: dict[str, Callable[[], Any]] = {
        "torch_rrc": lambda: TorchRandomResizedCrop(paths),
        "region": lambda: dataset(False),
        "tier_crop": lambda: dataset(True),
    }
    for r in range(args.repeats):
        for name, make in makers.items():
            ds = make()
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(100 + r)
            t0 = time.perf_counter()
            for i in range(items):
                ds[i]
            one[name].append((time.perf_counter() - t0) / items * 1e3)
            if hasattr(ds, "close"):
                ds.close()
    one_ms = {name: statistics.median(v) for name, v in one.items()}

    # a pass over every image from the tier decodes nothing
    check = dataset(True)
    assert check.pixels is not None
    for i in range(len(check)):
        assert tuple(check[i]["jpg"].shape) == (3, *SIZE)
    stats = dict(check.pixels.stats)
    check.close()
    if stats["built"] or stats["decoded"]:
        raise AssertionError(f"the tier epoch decoded images: {stats}")
    entries, nbytes = pixel_bytes(cache)
    return {
        "case": "crops",
        "images": args.images,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "max_side": args.max_side,
        "cpus": os.cpu_count(),
        "results": {
            name: {
                "samples_per_s": rate(name),
                "spread": [
                    min(e.samples / e.wall_s for e in eps),
                    max(e.samples / e.wall_s for e in eps),
                ],
            }
            for name, eps in results.items()
        },
        "ratios": {
            "tier_crop/region": rate("tier_crop") / rate("region"),
            "tier_crop/torch_rrc": rate("tier_crop") / rate("torch_rrc"),
            "region/torch_rrc": rate("region") / rate("torch_rrc"),
        },
        "one_process_ms_per_item": one_ms,
        "one_process_ratios": {
            "region/tier_crop": one_ms["region"] / one_ms["tier_crop"],
            "torch_rrc/tier_crop": one_ms["torch_rrc"] / one_ms["tier_crop"],
        },
        "tier_pass_stats": stats,
        "pixel_shards": entries,
        "pixel_bytes_per_image": nbytes / args.images,
    }


def _count(loader: Any) -> Any:
    for batch in loader:
        assert tuple(_images(batch).shape[1:]) == (3, *SIZE)
        yield batch


def check_every_image(url: str, cache: Path) -> int:
    """Every image of a ``tier`` epoch (``fastload.DataLoader``, built in this process
    from the tier) equals a fresh decode; returns how many were checked."""
    tiered = fastload.ShardedDataset(
        url, cache_dir=cache, decode="tensor", size=SIZE, pixel_cache=True
    )
    raw = fastload.ShardedDataset(url, cache_dir=cache)
    fresh = Decoder(image="tensor", size=SIZE, resize="exact")
    loader = fastload.DataLoader(tiered, batch_size=32, shuffle=True, num_workers=2, seed=99)
    checked = 0
    for batch in loader:
        for k, key in enumerate(batch["__key__"]):
            i = int(key.removeprefix("img"))
            if not torch.equal(batch["jpg"][k], fresh(raw[i])["jpg"]):
                raise AssertionError(f"image {key} from the tier differs from a fresh decode")
            checked += 1
    assert loader.worker_processes == 0
    assert loader.io_stats()["pixel_hits"] == len(raw) == checked
    return checked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shard-size", default="16MB")
    p.add_argument("--workdir", default=None, help="reuse images and shards here")
    p.add_argument("--json", default=None)
    p.add_argument("--case", choices=("tier", "crops"), default="tier")
    p.add_argument("--max-side", type=int, default=512, help="PixelCache(max_side) of crops")
    args = p.parse_args(argv)
    doc = run_crops(args) if args.case == "crops" else run(args)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
