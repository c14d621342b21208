"""Whole-epoch benchmark, decode mode, local data: fastload vs the naive way, same run.

COCO-sized JPEGs (640x480, ~155 KB) are written as an image folder and converted to
fastload shards (``fastload.convert.folder``) on local disk. Every variant delivers
the same images as collated ``uint8`` CHW 224x224 tensors (plus the class label),
through a DataLoader with the same ``--workers`` and ``--batch-size``:

- ``torch_files`` (baseline): ``torch.utils.data.DataLoader(shuffle=True)`` over a
  map-style Dataset that opens each JPEG file, decodes it with PIL,
  ``convert("RGB")``, ``resize((224, 224), BILINEAR)`` and returns a tensor;
- ``fastload_stream``: ``fastload.DataLoader(fastload.StreamingDataset(url,
  cache_dir=..., decode=tensor at 224x224))`` over the warm NVMe cache;
- ``fastload_sharded``: ``fastload.DataLoader(fastload.ShardedDataset(...),
  shuffle=True)``, random access over the same warm cache;
- ``fastload_stream_nodraft``: the streaming variant with JPEG draft decoding off
  (an ablation: how much of the gain is draft decoding, how much the rest);
- ``fastload_stream_noprefetch``: the streaming variant with ``prefetch_shards=0``
  (an ablation: the cost of re-scheduling prefetches of shards already cached);
- ``torch_files_iterable``: the baseline's files and decode as a torch
  ``IterableDataset`` (an ablation: iterable vs map-style in torch itself).

Every variant runs one untimed warm-up epoch (it fills the cache and the page
cache), then ``--repeats`` timed epochs, interleaved round by round with a rotating
order. Each epoch builds a fresh loader (worker start-up included, as in training).
Reported: samples/s (wall, median and [min, max]), MB/s of JPEG payload, samples per
CPU second (main process + workers; robust to other jobs on the machine) and the
ratios to the baseline.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_epoch.py [--images 400]
        [--repeats 5] [--workers 2] [--batch-size 32] [--json FILE]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

import fastload
from _epoch_common import (
    SIZE,
    Epoch,
    doc_head,
    environment,
    epoch_parser,
    folder_labels,
    make_image_folder,
    plain_decode_tensor,
    ratios,
    report,
    run_checked,
    time_epoch,
)
from _jpeg_files import JpegFiles
from fastload.decode import Decoder
from fastload.errors import ConfigError

SCHEMA = "fastload.bench_epoch/1"
#: candidate -> the baseline it is compared with
PAIRS = {
    "fastload_stream": "torch_files",
    "fastload_sharded": "torch_files",
    "torch_files_iterable": "torch_files",
    "fastload_stream_nodraft": "torch_files",
    "fastload_stream_noprefetch": "torch_files",
}
#: ablations, compared with the default streaming variant
ABLATIONS = {
    "fastload_stream": "fastload_stream_nodraft",  # the draft-decoding gain
    "fastload_stream_noprefetch": "fastload_stream",  # > 1: prefetching costs
}


class JpegFilesIterable(torch.utils.data.IterableDataset[tuple[Any, int]]):
    """The naive dataset as an iterable: a seeded permutation per epoch, split over
    DataLoader workers by whole batches (round-robin), each item read and decoded like
    :class:`JpegFiles`. It separates what comes from iterating (no per-batch index
    lists from the main process) from what fastload itself adds."""

    def __init__(self, files: JpegFiles, batch_size: int, seed: int = 0) -> None:
        super().__init__()
        self.files = files
        self.batch_size = batch_size
        self.seed = seed

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        order = torch.randperm(len(self.files), generator=torch.Generator().manual_seed(self.seed))
        for pos, i in enumerate(order.tolist()):
            if (pos // self.batch_size) % workers == worker:
                yield self.files[i]


def tensor_decoder(draft: bool = True) -> tuple[Any, str]:
    """The dataset ``decode=`` for 224x224 tensors, and how it was given.

    ``decode="tensor", size=(224, 224)`` is the documented spelling; if this version
    refuses it (a ``(height, width)`` size wants ``resize="exact"``), an explicit
    :class:`~fastload.decode.Decoder` with the same meaning is used and the JSON says so.
    """
    if draft:
        try:
            from fastload.datasets.options import make_decoder

            make_decoder("tensor", SIZE)
            return "tensor", 'decode="tensor", size=(224, 224)'
        except ConfigError:
            pass
    spelled = f'Decoder(image="tensor", size=(224, 224), resize="exact", draft={draft})'
    return Decoder(image="tensor", size=SIZE, resize="exact", draft=draft), spelled


def dataset_kwargs(decode: Any) -> dict[str, Any]:
    return {"decode": decode} if not isinstance(decode, str) else {"decode": decode, "size": SIZE}


def check_outputs(paths: list[Path], url: str, cache: Path, decode: Any) -> dict[str, Any]:
    """Both pipelines give the same images, up to draft decoding's resampling: the
    mean absolute difference (0..255) over the first images, and their shapes."""
    ds = fastload.ShardedDataset(url, cache_dir=cache, **dataset_kwargs(decode))
    diffs = []
    for i in range(min(8, len(ds))):
        mine = ds[i]["jpg"]
        theirs = plain_decode_tensor(paths[i].read_bytes())
        if mine.shape != theirs.shape:
            raise AssertionError(f"shape {tuple(mine.shape)} != baseline {tuple(theirs.shape)}")
        diffs.append(float((mine.int() - theirs.int()).abs().float().mean()))
    ds.close()
    return {"shape": list(theirs.shape), "mean_abs_diff_vs_baseline": float(np.mean(diffs))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fl-epoch-"))
    images_dir, shards_dir, cache = work / "images", work / "shards", work / "cache"
    t0 = time.perf_counter()
    paths = make_image_folder(images_dir, args.images)[: args.images]
    labels = folder_labels(paths)
    gen_s = time.perf_counter() - t0
    if shards_dir.exists():
        shutil.rmtree(shards_dir)
    if cache.exists():
        shutil.rmtree(cache)
    t0 = time.perf_counter()
    fastload.convert.folder(images_dir, str(shards_dir), shard_size=args.shard_size, progress=False)
    convert_s = time.perf_counter() - t0
    url = str(shards_dir)
    manifest = fastload.Manifest.load(url)
    if manifest.num_samples != len(paths):
        raise AssertionError(f"shards hold {manifest.num_samples} samples, not {len(paths)}")
    jpeg_bytes = sum(p.stat().st_size for p in paths)
    mean_bytes = jpeg_bytes / len(paths)
    decode, spelled = tensor_decoder(draft=True)
    nodraft, _ = tensor_decoder(draft=False)
    bs, nw = args.batch_size, args.workers

    def torch_files() -> Epoch:
        ds = JpegFiles(paths, labels)
        return time_epoch(
            lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True)
        )

    def torch_files_iterable() -> Epoch:
        ds = JpegFilesIterable(JpegFiles(paths, labels), bs)
        return time_epoch(lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw))

    def stream(dec: Any, prefetch_shards: int = 2) -> Epoch:
        ds = fastload.StreamingDataset(
            url,
            shuffle=True,
            cache_dir=cache,
            manifest=manifest,
            prefetch_shards=prefetch_shards,
            **dataset_kwargs(dec),
        )
        return time_epoch(lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw))

    def sharded() -> Epoch:
        ds = fastload.ShardedDataset(
            url, cache_dir=cache, manifest=manifest, **dataset_kwargs(decode)
        )
        return time_epoch(
            lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True)
        )

    variants = {
        "torch_files": torch_files,
        "torch_files_iterable": torch_files_iterable,
        "fastload_stream": lambda: stream(decode),
        "fastload_sharded": sharded,
        "fastload_stream_nodraft": lambda: stream(nodraft),
        "fastload_stream_noprefetch": lambda: stream(decode, prefetch_shards=0),
    }
    print(
        f"{len(paths)} JPEGs, {len(manifest.shards)} shards; {args.repeats} interleaved rounds",
        file=sys.stderr,
    )
    epochs, results = run_checked(variants, args.repeats, mean_bytes, len(paths), bs * nw)
    ratio_rows = ratios(results, epochs, PAIRS)
    ratio_rows.update(ratios(results, epochs, ABLATIONS))
    doc = {
        **doc_head(SCHEMA, len(paths), mean_bytes, len(manifest.shards), args),
        "output": f"uint8 CHW {SIZE[0]}x{SIZE[1]}, collated batches",
        "fastload_decode": spelled,
        "setup_s": {"generate": round(gen_s, 2), "convert": round(convert_s, 2)},
        "check": check_outputs(paths, url, cache, decode),
        "environment": environment(cache),
        "results": results,
        "ratios": ratio_rows,
        "meets_1_5x": {
            k: v is not None and v >= 1.5
            for k, v in ratio_rows["fastload_stream/torch_files"].items()
        },
    }
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = epoch_parser(__doc__, images=400, repeats=5, batch_size=32, shard_size="16MB")
    parser.add_argument("--workdir", default=None, help="keep images/shards/cache here")
    args = parser.parse_args(argv)
    doc = run(args)
    report(
        doc,
        f" in {doc['shards']} shards",
        [f"check: {doc['check']}; meets 1.5x: {doc['meets_1_5x']}"],
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
