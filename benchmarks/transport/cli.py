"""The command line: flags, the run of the sections asked for, the JSON document
(schema :data:`SCHEMA`) and the report."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transport
from _epoch_common import environment, epoch_parser
from transport.cold import section_cold
from transport.data import Ctx
from transport.decode import section_decode
from transport.report import print_doc
from transport.rss import rss_child, section_rss
from transport.warm import section_warm

SCHEMA = "fastload.bench_transport/1"
ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("warm", "cold", "decode", "rss")
#: what ``--quick`` makes the defaults: a smoke run of every section
QUICK: dict[str, Any] = {
    "images": 200,
    "shard_size": "4MB",
    "decode_images": 100,
    "rss_samples": 200,
    "repeats": 1,
}
SECTION_FNS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "warm": section_warm,
    "cold": section_cold,
    "decode": section_decode,
    "rss": section_rss,
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Make the data set, run the sections asked for; the JSON document."""
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fl-transport-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ctx = Ctx(args, work)
    setup_s = time.perf_counter() - t0
    sections = [args.only] if args.only else list(SECTIONS)
    print(
        f"{ctx.n} JPEGs (~{ctx.mean_bytes / 1000:.0f} KB) in {len(ctx.manifest.shards)} shards; "
        f"sections {sections}; {args.repeats} interleaved rounds",
        file=sys.stderr,
    )
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "images": ctx.n,
        "mean_jpeg_bytes": ctx.mean_bytes,
        "dataset_bytes": ctx.manifest.total_bytes,
        "shards": len(ctx.manifest.shards),
        "shard_size": args.shard_size,
        "workers": ctx.nw,
        "batch_size": ctx.bs,
        "repeats": args.repeats,
        "setup_s": round(setup_s, 1),
        "sections": {},
    }
    for name in sections:
        print(f"section {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        doc["sections"][name] = SECTION_FNS[name](ctx)
        doc["sections"][name]["section_s"] = round(time.perf_counter() - t0, 1)
    doc["environment"] = environment(ctx.cache)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the sections, print the report (and write the JSON)."""
    parser = epoch_parser(
        transport.__doc__ or "", images=2000, repeats=3, batch_size=64, shard_size="32MB"
    )
    parser.add_argument(
        "--decode-images", type=int, default=500, help="decode: the first N of the images"
    )
    parser.add_argument(
        "--decode-pil-resize",
        action="store_true",
        help="decode: also fl_pil_resize, the default with Pillow's resize (context)",
    )
    parser.add_argument("--rss-samples", type=int, default=2000, help="rss: small size (x10)")
    parser.add_argument(
        "--no-rehearse",
        dest="rehearse",
        action="store_false",
        help="cold: time each epoch without an untimed one of the same variant just before",
    )
    parser.add_argument(
        "--reported-reruns",
        type=int,
        default=2,
        help="cold: run a timed epoch again (at most N times per round, every variant "
        "alike) when the VM's free page reporting ran inside it; 0 keeps every epoch",
    )
    parser.add_argument(
        "--cold-streams",
        type=int,
        default=None,
        help="cold: FetchConfig(streams=N) for fastload's variants (default: the default, 16)",
    )
    parser.add_argument("--only", choices=SECTIONS, default=None, help="run one section")
    parser.add_argument("--workdir", default=None, help="keep/reuse images, shards here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: smaller defaults ("
        + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + "); flags given explicitly win",
    )
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if args.rss_child:
        print(json.dumps(rss_child(json.loads(args.rss_child))))
        return 0
    doc = run(args)
    print_doc(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0
