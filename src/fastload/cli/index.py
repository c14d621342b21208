"""``fastload index SHARD...``: build ``.idx`` sidecars (and DALI index files)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastload.cli.common import HelpFormatter, progress


def register(sub: Any) -> None:
    """Add the ``index`` subcommand."""
    p = sub.add_parser(
        "index",
        help="index local tar shards: write <shard>.idx sidecars",
        description="Scan local tar shards with the C++ scanner and write each one's "
        "<shard>.idx sidecar (and, with --dali, the index file DALI's webdataset reader "
        "takes, as <shard>.dali.idx).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("shards", nargs="+", metavar="SHARD", help="local .tar files")
    p.add_argument("--dali", action="store_true", help="also write <shard>.dali.idx for DALI")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Index each shard; exit 1 if any could not be indexed (the others are still done)."""
    from fastload.errors import FastloadError
    from fastload.shards.index import ShardIndex

    results: list[dict[str, Any]] = []
    failed = 0
    for path in progress(args.shards, desc="indexing", unit="shard"):
        try:
            index = ShardIndex.build(path)
            index.save(path + ".idx")
            if args.dali:
                index.write_dali_index(path + ".dali.idx")
        except (FastloadError, OSError) as exc:
            failed += 1
            print(f"fastload index: {exc}", file=sys.stderr)
            results.append({"shard": path, "error": str(exc)})
            continue
        results.append({"shard": path, "members": index.num_members, "samples": index.num_samples})
    if args.json:
        print(json.dumps({"version": 1, "shards": results}, indent=1))
    else:
        for r in results:
            if "error" not in r:
                print(f"{r['shard']}: {r['samples']} samples, {r['members']} members")
    return 1 if failed else 0
