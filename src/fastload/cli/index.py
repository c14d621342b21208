"""``fastload index SHARD...``: build ``.idx`` sidecars (and DALI index files)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastload.cli.common import HelpFormatter, add_json_option, print_result, progress


def register(sub: Any) -> None:
    """Add the ``index`` subcommand."""
    p = sub.add_parser(
        "index",
        help="index local tar shards: write <shard>.idx sidecars",
        description="Scan local tar shards with the C++ scanner and write each one's "
        "<shard>.idx sidecar (and, with --dali, the index file DALI's webdataset reader "
        "takes, as <shard>.dali.idx). A gzipped shard (.tar.gz, .tgz) is decompressed "
        "to a temporary file first; its sidecar describes the decompressed tar (what "
        "the cache holds), and DALI, which cannot read gzip, gets no index for it.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("shards", nargs="+", metavar="SHARD", help="local .tar files")
    p.add_argument("--dali", action="store_true", help="also write <shard>.dali.idx for DALI")
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Index each shard; exit 1 if any could not be indexed (the others are still done)."""
    from fastload.errors import FastloadError
    from fastload.shards.gzipped import is_gzip_name
    from fastload.shards.index import ShardIndex

    results: list[dict[str, Any]] = []
    failed = 0
    for path in progress(args.shards, desc="indexing", unit="shard"):
        try:
            gz = is_gzip_name(path)
            index = _index_gzipped(path) if gz else ShardIndex.build(path)
            index.save(path + ".idx")
            if args.dali and not gz:
                index.write_dali_index(path + ".dali.idx")
            elif args.dali:
                print(
                    f"fastload index: {path}: no DALI index for a gzipped shard "
                    "(DALI reads only plain tars)",
                    file=sys.stderr,
                )
        except (FastloadError, OSError) as exc:
            failed += 1
            print(f"fastload index: {exc}", file=sys.stderr)
            results.append({"shard": path, "error": str(exc)})
            continue
        results.append({"shard": path, "members": index.num_members, "samples": index.num_samples})
    lines = (
        f"{r['shard']}: {r['samples']} samples, {r['members']} members"
        for r in results
        if "error" not in r
    )
    print_result(args, {"shards": results}, lines)
    return 1 if failed else 0


def _index_gzipped(path: str) -> Any:
    """The index of the decompressed bytes of the local gzipped shard ``path``."""
    import os
    import tempfile

    from fastload.shards.gzipped import decompress_stream
    from fastload.shards.index import ShardIndex

    def chunks() -> Any:
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                yield block

    with tempfile.NamedTemporaryFile(
        prefix=".fastload-index-", dir=os.path.dirname(path) or "."
    ) as tmp:
        decompress_stream(chunks(), tmp.write, path)
        tmp.flush()
        index = ShardIndex.build(tmp.name, name=path)
    return ShardIndex.from_bytes(index.to_bytes(), name=path)
