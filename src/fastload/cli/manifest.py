"""``fastload manifest SHARDS``: make existing WebDataset shards a fastload dataset."""

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
    """Add the ``manifest`` subcommand."""
    p = sub.add_parser(
        "manifest",
        help="write index sidecars and manifest.json for existing WebDataset shards",
        description="Index and checksum existing tar shards (.tar, .tar.gz, .tgz) named by "
        "a brace pattern (train-{000000..000099}.tar), a glob or a prefix, write each "
        "one's <shard>.idx sidecar beside it and manifest.json at --out, so that "
        "fastload's datasets read them. The shards are not modified.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("shards", metavar="SHARDS", help="brace pattern, glob or prefix (path or URL)")
    p.add_argument(
        "--out",
        default=None,
        metavar="URL",
        help="where manifest.json goes: the shards' directory or one above it "
        "(unset: the shards' directory)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a manifest.json already at --out"
    )
    p.add_argument(
        "--workers", type=int, default=None, help="indexing threads (None: 2 per CPU, at most 16)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_option(p)
    add_storage_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Adopt the shards; print a summary (or JSON) on stdout. Returns 0."""
    from fastload.shards.adopt import write_manifest

    manifest = write_manifest(
        args.shards,
        out=args.out,
        storage_options=parse_storage_options(args.storage_options),
        overwrite=args.overwrite,
        workers=args.workers,
        progress=not args.quiet and sys.stderr.isatty(),
    )
    gz = sum(1 for s in manifest.shards if s.compression)
    doc = {
        "command": "manifest",
        "url": manifest.url,
        "shards": len(manifest.shards),
        "gzipped": gz,
        "samples": manifest.num_samples,
        "bytes": manifest.total_bytes,
        "fields": list(manifest.fields),
    }
    summary = (
        f"wrote {manifest.url.rstrip('/')}/manifest.json: {len(manifest.shards)} shard(s) "
        f"({gz} gzipped), {manifest.num_samples} samples, {manifest.total_bytes} bytes"
    )
    print_result(args, doc, [summary])
    return 0
