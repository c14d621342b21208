"""Whole-epoch benchmark from object storage (SeaweedFS on 127.0.0.1): one GET per
image vs fastload's shards through the node cache, cold and warm, in the same run.

A local SeaweedFS (:class:`fastload.bench.LocalS3`) gets the same COCO-sized JPEGs
(640x480, ~155 KB) twice: as one object per image, and as fastload shards written
straight to the bucket by ``fastload.convert.folder``. Variants, all through a
DataLoader with ``--workers`` workers and ``--batch-size``:

- ``naive_get`` (baseline): ``torch.utils.data.DataLoader(shuffle=True)`` over a
  map-style Dataset whose item ``i`` is one s3fs ``cat_file`` of image ``i`` (raw
  bytes, no decode); ``naive_get_decode`` the same plus PIL decode, ``convert("RGB")``,
  resize to 224x224 (bilinear) and a ``uint8`` CHW tensor;
- ``stream_cold`` / ``stream_warm``: ``fastload.DataLoader(fastload.StreamingDataset(url,
  cache_dir=...))`` raw bytes, with an empty cache directory each epoch (every shard
  comes from the server, once per node) or the cache left by the warm-up;
  ``stream_cold_decode`` / ``stream_warm_decode`` the same decoding to 224x224 tensors;
- ``sharded_cold`` / ``sharded_warm``: ``fastload.ShardedDataset`` raw bytes with
  ``fastload.DataLoader(shuffle=True)`` (random access).

One untimed warm-up epoch per variant, then ``--repeats`` timed epochs interleaved
round by round with a rotating order; a fresh loader each epoch. Reported: samples/s
(median, [min, max]), MB/s of JPEG payload, samples per CPU second of this process
and its workers (the SeaweedFS server's CPU is not in it), bytes fetched from the
server (fastload's own counters) and the ratios to the same-mode baseline.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_remote_epoch.py [--images 400]
        [--repeats 3] [--workers 2] [--batch-size 32] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
from fastload.bench import LocalS3
from fastload.decode import Decoder

SCHEMA = "fastload.bench_remote_epoch/1"


class S3Objects(torch.utils.data.Dataset[tuple[Any, int]]):
    """The naive dataset: item ``i`` is one GET of object ``keys[i]`` (s3fs
    ``cat_file``), decoded like the local baseline when ``decode``. The s3fs client is
    made lazily in each process (its event loop must not cross a fork)."""

    def __init__(
        self, keys: list[str], labels: list[int], s3fs_options: dict[str, Any], decode: bool
    ) -> None:
        self.keys = keys
        self.labels = labels
        self.s3fs_options = s3fs_options
        self.decode = decode
        self._fs: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.keys)

    def _filesystem(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            import s3fs

            self._fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.s3fs_options)
            self._pid = os.getpid()
        return self._fs

    def __getitem__(self, i: int) -> tuple[Any, int]:
        data = self._filesystem().cat_file(self.keys[i])
        return (plain_decode_tensor(data) if self.decode else data), self.labels[i]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"], state["_pid"] = None, -1
        return state


def upload_objects(server: LocalS3, bucket: str, paths: list[Path], root: Path) -> list[str]:
    """Put every JPEG as its own object ``<bucket>/images/<class>/<file>``; returns keys."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.s3fs_options())
    keys = [f"{bucket}/images/{p.relative_to(root).as_posix()}" for p in paths]
    fs.put([str(p) for p in paths], keys)
    missing = [k for k in keys if not fs.exists(k)]
    if missing:
        raise AssertionError(f"{len(missing)} objects missing after upload, e.g. {missing[0]}")
    return keys


def fastload_probe(loader: Any) -> dict[str, Any]:
    """The loader's I/O counters (summed over its workers) after an epoch."""
    return {k: int(v) for k, v in loader.io_stats().items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fl-remote-epoch-"))
    server = LocalS3(work / "weed").start()
    try:
        return _run(args, server, work)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, server: LocalS3, work: Path) -> dict[str, Any]:
    images_dir = Path(args.images_dir) if args.images_dir else work / "images"
    paths = make_image_folder(images_dir, args.images)[: args.images]
    labels = folder_labels(paths)
    bucket = server.new_bucket()
    t0 = time.perf_counter()
    keys = upload_objects(server, bucket, paths, images_dir)
    upload_s = time.perf_counter() - t0
    url = f"s3://{bucket}/shards"
    opts = server.storage_options
    t0 = time.perf_counter()
    fastload.convert.folder(
        images_dir, url, shard_size=args.shard_size, storage_options=opts, progress=False
    )
    convert_s = time.perf_counter() - t0
    manifest = fastload.Manifest.load(url, storage_options=opts)
    if manifest.num_samples != len(paths):
        raise AssertionError(f"shards hold {manifest.num_samples} samples, not {len(paths)}")
    mean_bytes = sum(p.stat().st_size for p in paths) / len(paths)
    bs, nw = args.batch_size, args.workers
    s3fs_options = server.s3fs_options()
    decoder = Decoder(image="tensor", size=SIZE, resize="exact")
    warm_dir = work / "cache-warm"
    fresh = iter(range(10**6))

    def naive(decode: bool) -> Epoch:
        ds = S3Objects(keys, labels, s3fs_options, decode)
        return time_epoch(
            lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True)
        )

    def cache_dir(cold: bool) -> Path:
        return work / f"cache-cold-{next(fresh)}" if cold else warm_dir

    def stream(cold: bool, decode: Any) -> Epoch:
        cache = cache_dir(cold)
        ds = fastload.StreamingDataset(
            url, shuffle=True, cache_dir=cache, storage_options=opts, manifest=manifest,
            decode=decode,
        )  # fmt: skip
        try:
            return time_epoch(
                lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw), fastload_probe
            )
        finally:
            ds.close()
            if cold:
                shutil.rmtree(cache, ignore_errors=True)

    def sharded(cold: bool) -> Epoch:
        cache = cache_dir(cold)
        ds = fastload.ShardedDataset(url, cache_dir=cache, storage_options=opts, manifest=manifest)
        try:
            return time_epoch(
                lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True),
                fastload_probe,
            )
        finally:
            ds.close()
            if cold:
                shutil.rmtree(cache, ignore_errors=True)

    variants = {
        "naive_get": lambda: naive(False),
        "stream_cold": lambda: stream(True, None),
        "stream_warm": lambda: stream(False, None),
        "sharded_cold": lambda: sharded(True),
        "sharded_warm": lambda: sharded(False),
        "naive_get_decode": lambda: naive(True),
        "stream_cold_decode": lambda: stream(True, decoder),
        "stream_warm_decode": lambda: stream(False, decoder),
    }
    print(
        f"{len(paths)} JPEGs as objects and in {len(manifest.shards)} shards at "
        f"{server.endpoint_url}; {args.repeats} interleaved rounds",
        file=sys.stderr,
    )
    epochs, results = run_checked(variants, args.repeats, mean_bytes, len(paths), bs * nw)
    for name, r in results.items():
        # fastload's epochs carry I/O counters (every epoch may carry reporting_passes)
        io = [e.extra for e in epochs[name] if "remote_bytes" in e.extra]
        if io:
            r["remote_bytes"] = sorted({x["remote_bytes"] for x in io})
            r["cache_misses"] = sorted({x["cache_misses"] for x in io})
        if name.startswith("naive"):
            r["requests_per_epoch"] = len(keys)
    raw_pairs = {
        "stream_cold": "naive_get",
        "stream_warm": "naive_get",
        "sharded_cold": "naive_get",
        "sharded_warm": "naive_get",
    }
    ratio_rows = ratios(results, epochs, raw_pairs)
    ratio_rows.update(
        ratios(
            results,
            epochs,
            {"stream_cold_decode": "naive_get_decode", "stream_warm_decode": "naive_get_decode"},
        )
    )
    return {
        **doc_head(SCHEMA, len(paths), mean_bytes, len(manifest.shards), args),
        "dataset_bytes": manifest.total_bytes,
        "server": {
            "kind": "SeaweedFS weed server -s3 on 127.0.0.1 (no network latency)",
            "command": " ".join(server.command()),
        },
        "setup_s": {"upload_objects": round(upload_s, 2), "convert_to_s3": round(convert_s, 2)},
        "environment": environment(work),
        "results": results,
        "ratios": ratio_rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = epoch_parser(__doc__, images=400, repeats=3, batch_size=32, shard_size="16MB")
    parser.add_argument("--images-dir", default=None, help="keep/reuse the generated JPEGs here")
    args = parser.parse_args(argv)
    doc = run(args)
    report(
        doc,
        f", objects vs {doc['shards']} shards in SeaweedFS on 127.0.0.1",
        [
            f"{name:<22} fetched {r['remote_bytes']} B, cache misses {r['cache_misses']}"
            for name, r in doc["results"].items()
            if "remote_bytes" in r
        ],
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
