"""``fastload inspect URL|PATH``: summarise a dataset (its manifest) or one local shard."""

from __future__ import annotations

import argparse
import collections
import os
from collections.abc import Iterator
from typing import Any

from fastload.cli.common import (
    HelpFormatter,
    add_json_option,
    add_storage_options,
    parse_storage_options,
    print_result,
    printable_tree,
)
from fastload.config import format_size


def register(sub: Any) -> None:
    """Add the ``inspect`` subcommand."""
    p = sub.add_parser(
        "inspect",
        help="summarise a dataset (URL of its root) or a local tar shard",
        description="Print a dataset's summary from its manifest.json (shards, samples, "
        "bytes, fields, source), or a local shard's (members, samples, fields, first keys).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("target", metavar="URL|PATH", help="dataset root URL, or a local .tar shard")
    add_json_option(p)
    p.add_argument("--samples", type=int, default=5, help="how many sample keys to list")
    add_storage_options(p)
    p.set_defaults(func=run)


def shard_summary(path: str, samples: int = 5) -> dict[str, Any]:
    """Return a summary of a local shard (built with its sidecar or by scanning it)."""
    from fastload.shards.index import ShardIndex

    sidecar = path + ".idx"
    # a sidecar that describes a shard of another size is refused, not trusted
    index = ShardIndex.for_shard(path)
    fields: collections.Counter[str] = collections.Counter()
    field_bytes: collections.Counter[str] = collections.Counter()
    smallest: dict[str, int] = {}
    largest: dict[str, int] = {}
    for i in range(index.num_samples):
        for name, span in index.sample(i).items():
            if name != "__key__":
                assert isinstance(span, tuple)
                size = int(span[1])
                fields[name] += 1
                field_bytes[name] += size
                smallest[name] = min(smallest.get(name, size), size)
                largest[name] = max(largest.get(name, size), size)
    return {
        "version": 1,
        "kind": "shard",
        "path": path,
        "bytes": index.shard_size,
        "members": index.num_members,
        "samples": index.num_samples,
        "indexed_from": "sidecar" if os.path.exists(sidecar) else "scan",
        # per field: items holding it, their total bytes and the per-item extremes
        "fields": {
            k: {
                "count": fields[k],
                "bytes": field_bytes[k],
                "min_bytes": smallest[k],
                "max_bytes": largest[k],
            }
            for k in sorted(fields)
        },
        "first_keys": [index.key(i) for i in range(min(samples, index.num_samples))],
    }


def dataset_summary(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """Return a summary of a dataset from its manifest alone."""
    from fastload.shards.manifest import Manifest

    m = Manifest.load(url, storage_options)
    sizes = [s.bytes for s in m.shards] or [0]
    source = dict(m.source)
    return {
        "version": 1,
        "kind": "dataset",
        "url": url,
        "created_by": m.created_by,
        "shards": len(m.shards),
        "samples": m.num_samples,
        "bytes": m.total_bytes,
        "index_bytes": sum(s.index_bytes for s in m.shards),
        "shard_bytes": {"min": min(sizes), "max": max(sizes), "mean": sum(sizes) / len(sizes)},
        "fields": list(m.fields),
        "shard_kind": m.kind,
        **(_token_facts(m.source) if m.kind == "tokens" else {}),
        "source": {
            k: (f"<{len(v)} entries>" if isinstance(v, (list, dict)) and len(v) > 10 else v)
            for k, v in source.items()
        },
    }


def _token_facts(source: Any) -> dict[str, Any]:
    """Tokens, documents, dtype and vocabulary of a token dataset's manifest."""
    return {"tokens": {k: source.get(k) for k in ("tokens", "documents", "dtype", "vocab_size",
                                                  "eos_id")}}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Print the summary; exit 1 on an unreadable target."""
    target: str = args.target
    local = target.removeprefix("file://")
    if os.path.isfile(local) and not local.endswith(".json"):
        info = shard_summary(local, args.samples)
    else:
        info = dataset_summary(target, parse_storage_options(args.storage_options))
    print_result(args, info, _summary_lines(info, args.samples))
    return 0


def _summary_lines(info: dict[str, Any], samples: int) -> Iterator[str]:
    """The human summary of :func:`shard_summary`'s or :func:`dataset_summary`'s ``info``."""
    info = printable_tree(info)  # manifest and member strings: anyone may have written them
    if info["kind"] == "shard":
        yield f"shard    {info['path']}"
        yield f"bytes    {format_size(info['bytes'])} ({info['bytes']})"
        yield f"members  {info['members']}"
        yield f"samples  {info['samples']}  (index from {info['indexed_from']})"
        for name, f in info["fields"].items():
            mean = f["bytes"] / f["count"]
            yield (
                f"field    {name:<16} {f['count']:>8} items, {format_size(f['bytes'])} in all; "
                f"per item {format_size(mean)} on average (min {format_size(f['min_bytes'])}, "
                f"max {format_size(f['max_bytes'])})"
            )
        more = " ..." if info["samples"] > samples else ""
        yield f"keys     {', '.join(info['first_keys'])}{more}"
    else:
        yield f"dataset  {info['url']}"
        yield f"shards   {info['shards']}"
        yield f"samples  {info['samples']}"
        yield f"bytes    {format_size(info['bytes'])} (+ {format_size(info['index_bytes'])} index)"
        sb = info["shard_bytes"]
        yield (
            f"shard    per shard: min {format_size(sb['min'])}, mean {format_size(sb['mean'])}, "
            f"max {format_size(sb['max'])}"
        )
        if info["samples"]:
            yield f"sample   {format_size(info['bytes'] / info['samples'])} per sample on average"
        yield f"fields   {', '.join(info['fields'])}"
        if "tokens" in info:
            t = info["tokens"]
            yield (f"tokens   {t['tokens']} {t['dtype']} tokens of {t['documents']} documents "
                   f"(vocabulary {t['vocab_size']}, EOS {t['eos_id']})")  # fmt: skip
        for k, v in info["source"].items():
            yield f"source   {k}: {v}"
