"""``fastload cache stats|verify|clear|warm``: inspect and manage the node-local cache.

``--cache-dir`` defaults to ``$FASTLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastload``,
else ``~/.cache/fastload``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, BinaryIO, cast

from fastload.cli.common import (
    HelpFormatter,
    add_json_option,
    add_storage_options,
    parse_storage_options,
    print_result,
    printable,
)
from fastload.config import default_cache_dir, format_size

__all__ = ["default_cache_dir", "register", "run"]


def register(sub: Any) -> None:
    """Add the ``cache`` subcommand and its actions."""
    p = sub.add_parser(
        "cache",
        help="inspect, verify, clear or pre-stage the node-local shard cache",
        description="Manage the node-local shard cache shared by every process on this node.",
        formatter_class=HelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir",
        default=default_cache_dir(),
        help="cache directory (env FASTLOAD_CACHE_DIR)",
    )
    add_json_option(common)
    common.add_argument(
        "--shared",
        action="store_true",
        help="the directory is shared by a group that trusts itself (2770/0660 allowed)",
    )

    def action(name: str, what: str) -> Any:
        """An action's parser, with the options every action takes."""
        return actions.add_parser(
            name,
            parents=[common],
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
            help=what,
        )

    action("stats", "entries, bytes used, states, pins and lifetime counters")
    v = action("verify", "re-hash every entry; exit 1 if any is damaged")
    v.add_argument(
        "--repair",
        action="store_true",
        help="drop damaged entries (re-fetched later) and remove the leftovers found",
    )
    action("clear", "remove every entry not in use right now")
    w = action("warm", "pre-stage every shard and index of a dataset into the cache")
    w.add_argument("url", metavar="URL", help="dataset root (holding manifest.json)")
    w.add_argument("--cache-limit", default=None, help="byte cap of the cache, e.g. 400GB")
    add_storage_options(w)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; returns the exit status."""
    action = {"stats": _stats, "verify": _verify, "clear": _clear, "warm": _warm}[args.action]
    return action(args)


def _open(
    args: argparse.Namespace, create: bool = False, limit: str | None = None, sweep: bool = True
) -> Any:
    from fastload.cache import DiskTier
    from fastload.errors import ConfigError

    root = Path(args.cache_dir).expanduser()
    if not create and not (root / "catalog.sqlite").exists():
        raise ConfigError(f"no fastload cache at {root} (no catalog.sqlite there)")
    return DiskTier(root, cache_limit=limit, shared=bool(args.shared), sweep=sweep)


def _emit(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> None:
    # catalog strings: untrusted
    print_result(args, doc, (printable(line) for line in lines), sort_keys=True)


def _stats(args: argparse.Namespace) -> int:
    from fastload.text.parquet_build import token_caches

    root = Path(args.cache_dir).expanduser()
    tokens = token_caches(root)
    if tokens and not (root / "catalog.sqlite").exists():  # only local parquet tokenized here
        doc: dict[str, Any] = {"cache_dir": str(root), "entries": 0, "bytes_used": 0,
                               "token_datasets": tokens}  # fmt: skip
        _emit(args, doc, [f"cache dir   {root}", *_token_lines(tokens)])
        return 0
    tier = _open(args)
    entries = tier.entries()
    from fastload.cache.derived import derived_kind

    states: dict[str, int] = {}
    datasets: dict[str, dict[str, int]] = {}
    pixels = {"entries": 0, "bytes": 0}  # the decoded-pixel tier's shards (pixel_cache=)
    for e in entries:
        states[e.state.name] = states.get(e.state.name, 0) + 1
        if e.state.name == "READY":
            d = datasets.setdefault(e.dataset, {"entries": 0, "bytes": 0})
            d["entries"] += 1
            d["bytes"] += e.size
            if derived_kind(e.shard) == "px":
                pixels["entries"] += 1
                pixels["bytes"] += e.size
    from fastload.cache.external import KINDS, entry_kind

    # everything under cache_dir that the cap counts, by kind (in-flight: reserved)
    kinds = {k: {"entries": 0, "bytes": 0, "in_flight": 0, "in_flight_bytes": 0} for k in KINDS}
    for e in entries:
        k = kinds[entry_kind(e.dataset, e.shard)]
        if e.state.name == "READY":
            k["entries"] += 1
            k["bytes"] += e.size
        elif e.state.name == "FETCHING":
            k["in_flight"] += 1
            k["in_flight_bytes"] += e.size
    ready = [e for e in entries if e.state.name == "READY"]
    counters = {k: int(v) for k, v in sorted(tier.lifetime_counters().items())}
    usage = tier.usage()
    doc = {
        "cache_dir": str(tier.root),
        "cache_limit": usage["cap"],
        "disk_bytes": usage["total"],
        "metadata_bytes": usage["metadata"],
        "entries": len(ready),
        "bytes_used": sum(e.size for e in ready),
        "pinned": sum(1 for e in entries if e.pins),
        "states": states,
        "datasets": datasets,
        "pixel_shards": pixels,
        "kinds": kinds,
        "counters": counters,
    }
    lines = [
        f"cache dir   {tier.root}",
        f"entries     {len(ready)}",
        f"bytes used  {format_size(doc['bytes_used'])}",
        "cache limit "
        + ("none" if usage["cap"] is None else format_size(int(usage["cap"])))
        + f" (counted now: {format_size(int(usage['total'] or 0))}, of which metadata "
        f"{format_size(int(usage['metadata'] or 0))})",
        f"pinned      {doc['pinned']}",
        "states      " + (", ".join(f"{k}={v}" for k, v in sorted(states.items())) or "-"),
    ]
    for name, d in sorted(datasets.items()):
        lines.append(f"dataset     {name}: {d['entries']} entries, {format_size(d['bytes'])}")
    lines.append(
        f"pixel tier  {pixels['entries']} pixel shards, {format_size(pixels['bytes'])} "
        "(decoded images, pixel_cache=; counted in bytes used)"
    )
    kinds["metadata"]["bytes"] = int(usage["metadata"] or 0)
    for name, k in kinds.items():
        flight = f", {k['in_flight']} in flight ({format_size(k['in_flight_bytes'])})"
        lines.append(
            f"kind {name:<8} {k['entries']} entries, {format_size(k['bytes'])}"
            + (flight if k["in_flight"] else "")
        )
    for key, value in counters.items():
        lines.append(f"{key:<15} {value}")
    from fastload.datasets.cached import item_caches

    doc["item_caches"] = [dataclasses.asdict(c) for c in item_caches(tier.root)]
    for c in doc["item_caches"]:
        note = f" (not read: {c['problem']})" if c["problem"] else ""
        size = format_size(c["bytes"])
        lines.append(f"cached()    {c['name']}: {c['items']} items, {size}{note}")
    doc["token_datasets"] = tokens
    lines.extend(_token_lines(tokens))
    _emit(args, doc, lines)
    return 0


def _token_lines(tokens: list[dict[str, Any]]) -> list[str]:
    """One line per token dataset ParquetTokenDataset published in the cache dir."""
    lines = []
    for t in tokens:
        size = format_size(int(t["bytes"]))
        if t.get("pending"):
            lines.append(f"tokens      {t['key']}: unfinished build, {size}")
        elif "problem" in t:
            lines.append(f"tokens      {t['key']}: {t['problem']}")
        else:
            lines.append(f"tokens      {t['key'][:12]}: {t['tokens']} tokens of {t['documents']} "
                         f"documents, {t['shards']} shard(s), {size}")  # fmt: skip
    return lines


def _verify(args: argparse.Namespace) -> int:
    tier = _open(args, sweep=False)  # leftovers are reported first, removed with --repair
    leftovers = tier.leftovers()
    checked = len([e for e in tier.entries() if e.state.name == "READY"])
    from fastload.cache.external import entry_kind

    checked_kinds: dict[str, int] = {}
    for e in tier.entries():
        if e.state.name == "READY":
            kind = entry_kind(e.dataset, e.shard)
            checked_kinds[kind] = checked_kinds.get(kind, 0) + 1
    bad = tier.verify(repair=args.repair)
    if args.repair:
        tier.sweep(full=True)
    doc = {
        "cache_dir": str(tier.root),
        "checked": checked,
        "bad": [
            {
                "name": b.name,
                "dataset": b.dataset,
                "shard": b.shard,
                "kind": entry_kind(b.dataset, b.shard),
                "reason": b.reason,
            }
            for b in bad
        ],
        "checked_kinds": checked_kinds,
        "leftovers": leftovers,
        "repaired": bool(args.repair),
    }
    lines = [
        f"bad ({entry_kind(b.dataset, b.shard)}): {b.dataset} {b.shard}: {b.reason}" for b in bad
    ]
    for kind, items in leftovers.items():
        lines.extend(f"leftover ({kind.replace('_', ' ')}): {item}" for item in items)
    verdict = "dropped" if args.repair else "found"
    found = sum(map(len, leftovers.values()))
    lines.append(
        f"checked {checked} entries, {verdict} {len(bad)} bad; {found} leftover(s)"
        + (" removed" if args.repair and found else "")
    )
    _emit(args, doc, lines)
    return 1 if bad else 0


def _by_kind(tier: Any) -> dict[str, list[int]]:
    from fastload.cache.external import KINDS, entry_kind

    out = {k: [0, 0] for k in KINDS if k != "metadata"}
    for e in tier.entries():
        if e.state.name == "READY":
            out[entry_kind(e.dataset, e.shard)][0] += 1
            out[entry_kind(e.dataset, e.shard)][1] += e.size
    return out


def _clear(args: argparse.Namespace) -> int:
    tier = _open(args)
    before = _by_kind(tier)
    removed, freed = tier.clear()
    after = _by_kind(tier)
    left = len(tier.entries())
    from fastload.datasets.cached import clear_item_caches

    caches, item_bytes = clear_item_caches(tier.root)
    doc = {"cache_dir": str(tier.root), "removed": removed, "bytes_freed": freed, "left": left}
    doc.update(item_caches_removed=caches, item_bytes_freed=item_bytes)
    doc["kinds"] = {
        k: {"removed": before[k][0] - after[k][0], "bytes_freed": before[k][1] - after[k][1],
            "left": after[k][0]}
        for k in before
    }  # fmt: skip
    _emit(
        args,
        doc,
        [
            f"removed {removed} entries ({format_size(freed)}); {left} left in use",
            f"removed {caches} fastload.cached() item caches ({format_size(item_bytes)})",
        ]
        + [
            f"kind {k:<8} removed {v['removed']} ({format_size(v['bytes_freed'])}), "
            f"{v['left']} left in use"
            for k, v in doc["kinds"].items()
        ],
    )
    return 0


class _Counted:
    """A file's ``write`` that also reports the bytes written (the progress bar of a
    shard decompressed into the cache)."""

    def __init__(self, f: Any, advance: Any) -> None:
        self._f = f
        self._advance = advance

    def write(self, data: Any) -> int:
        n = int(self._f.write(data))
        self._advance(n)
        return n


def _warm(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fastload.cache import EntryKey
    from fastload.cache.shard_cache import dataset_id
    from fastload.shards.checksum import Xxh3Hasher
    from fastload.shards.gzipped import fetch_shard, is_gzip_name
    from fastload.shards.manifest import Manifest
    from fastload.storage import open_store

    options = parse_storage_options(args.storage_options)
    manifest = Manifest.load(args.url, options)
    store = open_store(args.url, options)
    tier = _open(args, create=True, limit=args.cache_limit)
    ds = dataset_id(args.url)
    # the entries the datasets read, under the keys they look up: a gzipped shard's
    # entry is its decompressed tar (the manifest's size and checksum are the tar's)
    jobs = []
    for s in manifest.shards:
        jobs.append((s.name, s.bytes, s.checksum))
        jobs.append((s.index_name, s.index_bytes, s.index_checksum))
    total = sum(size for _, size, _ in jobs)
    fetched_before = tier.stats().bytes_fetched
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="warming",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    ) as bar:
        for name, size, checksum in jobs:
            key = EntryKey(ds, name, checksum)
            shown = [0]

            def advance(n: int, shown: list[int] = shown) -> None:
                shown[0] += n
                bar.update(n)

            def fetch(f: Any, name: str = name, size: int = size) -> Xxh3Hasher:
                # the bytes hashed as they are written, so the tier need not read the
                # file back to verify it (it does when they were not fed whole)
                digest = Xxh3Hasher()
                if is_gzip_name(name):
                    # what the datasets' fetch writes: the object streamed and
                    # decompressed into the entry (the tier verifies the tar's checksum)
                    out = cast("BinaryIO", _Counted(f, advance))
                    fetch_shard(store, name, out, size, digest=digest)
                else:
                    store.download(name, f, expected_size=size, progress=advance, digest=digest)
                return digest

            tier.get(key, size, fetch)
            bar.update(size - shown[0])  # a hit (or a retried part) moves the bar here
    fetched = tier.stats().bytes_fetched - fetched_before
    doc = {
        "cache_dir": str(tier.root),
        "dataset": ds,
        "shards": len(manifest.shards),
        "objects": len(jobs),
        "bytes": total,
        "bytes_fetched": fetched,
    }
    _emit(
        args,
        doc,
        [
            f"warmed {len(manifest.shards)} shards (+ indexes) of {ds}: {format_size(total)}, "
            f"{format_size(fetched)} fetched now"
        ],
    )
    return 0
