"""``fastload convert coco|cityscapes|folder``: write a dataset as fastload shards."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastload.cli.common import (
    HelpFormatter,
    add_json_option,
    add_storage_options,
    parse_storage_options,
    print_result,
)


def register(sub: Any) -> None:
    """Add the ``convert`` subcommand and its ``coco``, ``cityscapes``, ``folder`` forms."""
    p = sub.add_parser(
        "convert",
        help="convert COCO, Cityscapes or an image folder to fastload shards; "
        "'convert text': JSONL/JSON/parquet text or chat data to token shards",
        description="Read a dataset in its original layout, check every image decodes, and "
        "write tar shards, index sidecars and manifest.json to OUT_URL.",
        formatter_class=HelpFormatter,
    )
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)

    coco = kinds.add_parser(
        "coco",
        help="COCO detection: an image directory and its instances_*.json",
        formatter_class=HelpFormatter,
    )
    coco.add_argument("--images", required=True, metavar="DIR", help="directory of the images")
    coco.add_argument(
        "--annotations", required=True, metavar="FILE", help="COCO annotation JSON file"
    )

    cs = kinds.add_parser(
        "cityscapes",
        help="one split of Cityscapes (leftImg8bit/ and gtFine/ or gtCoarse/)",
        formatter_class=HelpFormatter,
    )
    cs.add_argument("root", metavar="ROOT", help="Cityscapes root directory")
    cs.add_argument("--split", default="train", help="train, val, test (fine) or train_extra")
    cs.add_argument("--mode", default="fine", choices=("fine", "coarse"), help="annotation set")

    folder = kinds.add_parser(
        "folder",
        help="an image folder with one subdirectory per class",
        formatter_class=HelpFormatter,
    )
    folder.add_argument("root", metavar="DIR", help="folder of class subdirectories")

    for q in (coco, cs, folder):
        q.add_argument("out", metavar="OUT_URL", help="dataset root to write (path or URL)")
        q.add_argument("--shard-size", default="256MB", help="target size of each shard")
        q.add_argument(
            "--workers", type=int, default=None, help="reader threads (None: 2 per CPU, at most 16)"
        )
        q.add_argument(
            "--skip-bad",
            action="store_true",
            help="leave out missing or corrupt inputs and list them, instead of failing",
        )
        q.add_argument(
            "--no-verify", action="store_true", help="do not decode every image to check it"
        )
        q.add_argument(
            "--overwrite",
            action="store_true",
            help="replace a dataset already at OUT_URL (kept readable until the new one is "
            "complete)",
        )
        q.add_argument(
            "--ray",
            action="store_true",
            help="read and write in Ray tasks (the cluster at RAY_ADDRESS, else a local "
            "runtime); needs the 'ray' extra",
        )
        q.add_argument("--quiet", action="store_true", help="no progress bar")
        add_json_option(q)
        add_storage_options(q)
        q.set_defaults(func=run)

    from fastload.cli.convert_text import register_text

    register_text(kinds)


def run(args: argparse.Namespace) -> int:
    """Run the conversion; print the report (or JSON) on stdout. Returns 0."""
    from fastload import convert

    common: dict[str, Any] = {
        "shard_size": args.shard_size,
        "storage_options": parse_storage_options(args.storage_options),
        "workers": args.workers,
        "on_error": "skip" if args.skip_bad else "raise",
        "progress": not args.quiet and sys.stderr.isatty(),
        "verify": not args.no_verify,
        "overwrite": args.overwrite,
        "executor": "ray" if args.ray else "local",
    }
    if args.kind == "coco":
        report = convert.coco(args.images, args.annotations, args.out, **common)
    elif args.kind == "cityscapes":
        report = convert.cityscapes(args.root, args.out, split=args.split, mode=args.mode, **common)
    else:
        report = convert.folder(args.root, args.out, **common)
    print_result(args, {"command": "convert", **report.to_dict()}, [report.summary()])
    return 0
