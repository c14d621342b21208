"""Adopting existing WebDataset shards: index, checksum, sidecars and ``manifest.json``.

``write_manifest("s3://bucket/wds/train-{000000..000099}.tar")`` (or a glob, or a
prefix) finds the shards, indexes each one with the C++ scanner (plain ``.tar``, or
``.tar.gz``/``.tgz`` decompressed while streaming, see :mod:`fastload.shards.gzipped`),
checksums it, writes its ``<shard>.idx`` sidecar and finally the manifest, so that
:class:`fastload.ShardedDataset` and :class:`fastload.StreamingDataset` read the
shards with every feature. The shards themselves are never written or moved.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from fastload.config import default_workers
from fastload.errors import ConfigError, ShardFormatError
from fastload.shards.checksum import file_checksum
from fastload.shards.gzipped import GZIP_SUFFIXES, decompress_stream, is_gzip_name, read_chunks
from fastload.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, indexed_shard
from fastload.shards.writer import defer_interrupts, previous_dataset

__all__ = ["SHARD_SUFFIXES", "expand_braces", "find_shards", "index_shard", "write_manifest"]

#: Object names a prefix or glob picks up as shards.
SHARD_SUFFIXES = (".tar", *GZIP_SUFFIXES)
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MAX_EXPANSION = 10_000_000
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000000..000099}`` ranges (zero padding kept, as the widest bound) and
    ``{a,b,c}`` lists, as webdataset's ``braceexpand`` does, left to right.

    Raises :class:`ConfigError` for an empty or over-large expansion.
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    r = _RANGE.match(body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        if abs(hi - lo) >= _MAX_EXPANSION:
            raise ConfigError(f"{pattern}: brace range {body} is too large")
        options = [f"{v:0{width}d}" for v in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:
        options = ["{" + body + "}"]  # not a pattern: kept literally
    head, tail = pattern[: m.start()], pattern[m.end() :]
    rest = expand_braces(tail)
    return [head + o + t for o in options for t in rest]


def _split_root(spec: str, first_special: int) -> tuple[str, str]:
    """``(directory URL, pattern relative to it)`` around the last ``/`` before the
    first pattern character."""
    slash = spec.rfind("/", 0, first_special)
    if slash < 0:
        return ".", spec
    return spec[:slash] or "/", spec[slash + 1 :]


def find_shards(
    spec: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[str, list[str]]:
    """The shards ``spec`` names: ``(root URL, [shard names relative to it])``.

    ``spec`` is a brace pattern (``.../train-{000000..000099}.tar``: taken as given, in
    that order), a glob (``.../train-*.tar``: matched against a listing) or a prefix
    (every ``.tar``, ``.tar.gz`` and ``.tgz`` below it, sorted). Raises
    :class:`ConfigError` if nothing matches.
    """
    from fastload.storage import open_store

    spec = os.fspath(spec)
    if "{" in spec:
        root, pattern = _split_root(spec, spec.index("{"))
        names = expand_braces(pattern)
    elif any(c in spec for c in "*?["):
        first = min(spec.index(c) for c in "*?[" if c in spec)
        root, pattern = _split_root(spec, first)
        names = [n for n in open_store(root, storage_options).list() if fnmatch.fnmatch(n, pattern)]
    else:
        root = spec.rstrip("/") or "/"
        listed = open_store(root, storage_options).list()
        names = [n for n in listed if n.lower().endswith(SHARD_SUFFIXES)]
    if not names:
        raise ConfigError(f"{spec}: no shards found (want .tar, .tar.gz or .tgz objects)")
    if len(set(names)) != len(names):
        raise ConfigError(f"{spec}: the pattern names some shards more than once")
    return root, names


def _fields(index: Any) -> set[str]:
    out = set()
    for name in index.names:
        base = name.rfind("/") + 1
        out.add(name[name.index(".", base) + 1 :])
    return out


def index_shard(
    store: Any, name: str, tmp_dir: str | None = None
) -> tuple[ShardInfo, bytes, set[str]]:
    """Index, checksum and describe one existing shard ``name`` of ``store``.

    Returns ``(ShardInfo with index name "<name>.idx", the .idx bytes, its fields)``.
    A local plain shard is mapped where it lies; any other is first copied (and a
    gzipped one decompressed, streaming) into a temporary file. Raises
    :class:`ShardFormatError` naming the shard for a malformed or refused archive.
    """
    from fastload.shards.index import ShardIndex

    url = store.url(name)
    local = store.root.removeprefix("file://") if store.protocol == "file" else None
    compressed: tuple[int, str] | None = None
    if local is not None and not is_gzip_name(name):
        path = os.path.join(local, name)
        if not os.path.isfile(path):
            raise ConfigError(f"{url}: shard does not exist")
        index = ShardIndex.build(path, name=url)
        size, checksum = file_checksum(path)
    else:
        with tempfile.NamedTemporaryFile(dir=tmp_dir, prefix=".fastload-adopt-") as tmp:
            if is_gzip_name(name):
                seen = decompress_stream(read_chunks(store, name), tmp.write, url)
                compressed = (seen.compressed_bytes, seen.compressed.hexdigest_tagged())
            else:
                store.download(name, tmp)
            tmp.flush()
            index = ShardIndex.build(tmp.name, name=url)
            size, checksum = file_checksum(tmp.name)
    if index.shard_size != size:  # the file changed while it was read
        raise ShardFormatError(f"shard changed while it was indexed ({size} bytes now)", url)
    idx = index.to_bytes()
    info = indexed_shard(name, size, index.num_samples, checksum, idx)
    if compressed is not None:
        info = replace(
            info,
            compression="gzip",
            compressed_bytes=compressed[0],
            compressed_checksum=compressed[1],
        )
    return info, idx, _fields(index)


def write_manifest(
    shards: str,
    out: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    progress: bool = False,
) -> Manifest:
    """Make existing WebDataset shards a fastload dataset; return its manifest.

    ``shards`` is a brace pattern, a glob or a prefix (see :func:`find_shards`).
    Each shard is indexed and checksummed, and its ``<shard>.idx`` sidecar written
    beside it, on ``workers`` threads (default: 4 per CPU, at most 32: the work is
    mostly waiting for reads and fsyncs); ``manifest.json`` is written last, at
    ``out``: by default the shards' directory, otherwise that directory or one above
    it (shard names in a manifest are relative to it).
    Gzipped shards are recorded with both their compressed object and their
    decompressed size and checksum. An ``out`` that already holds a manifest is
    refused (:class:`~fastload.errors.OutputExistsError`) unless ``overwrite``.

    Raises :class:`ConfigError` when nothing matches or ``out`` is not above the
    shards, and :class:`ShardFormatError` naming the first shard that cannot be
    indexed (no manifest is written then).
    """
    from fastload.storage import open_store

    root, names = find_shards(shards, storage_options)
    store = open_store(root, storage_options)
    for name in names:
        if not _NAME_RE.match(name) or ".." in name.split("/"):
            raise ConfigError(
                f"{store.url(name)}: a manifest can only name shards whose paths use "
                "letters, digits, '.', '_', '-' and '/'"
            )
    out_store = store if out is None else open_store(out, storage_options)
    prefix = ""
    if out_store.root != store.root:
        if not store.root.startswith(out_store.root.rstrip("/") + "/"):
            raise ConfigError(
                f"{out}: the manifest must be written in the shards' directory {store.root} "
                "or a directory above it (it names shards relative to itself)"
            )
        prefix = store.root[len(out_store.root.rstrip("/")) + 1 :] + "/"
    out_url = out if out is not None else root
    previous_dataset(out_store, out_url, overwrite)
    workers = workers or default_workers("adopt")
    tmp_dir = tempfile.mkdtemp(prefix="fastload-adopt-")
    try:
        results = _index_all(store, names, workers, tmp_dir, progress, out_store, prefix)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    infos = []
    fields: set[str] = set()
    for info, _idx, shard_fields in results:
        rel = prefix + info.name
        infos.append(replace(info, name=rel, index_name=rel + ".idx"))
        fields |= shard_fields
    source = {"kind": "webdataset", "adopted_from": shards}
    manifest = Manifest.build(infos, fields, source, url=out_url)
    with defer_interrupts():
        out_store.write_bytes(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
    return manifest


def _index_and_save(
    store: Any, name: str, tmp_dir: str, out_store: Any, prefix: str
) -> tuple[ShardInfo, bytes, set[str]]:
    """:func:`index_shard`, then the sidecar written at ``out_store`` (in the worker
    thread, so that the writes' fsyncs overlap)."""
    result = index_shard(store, name, tmp_dir)
    out_store.write_bytes(prefix + name + ".idx", result[1])
    return result


def _index_all(
    store: Any,
    names: list[str],
    workers: int,
    tmp_dir: str,
    progress: bool,
    out_store: Any,
    prefix: str,
) -> list[tuple[ShardInfo, bytes, set[str]]]:
    from tqdm import tqdm

    bar = tqdm(
        total=len(names), desc="indexing shards", unit="shard", file=sys.stderr,
        disable=not progress, dynamic_ncols=True,
    )  # fmt: skip
    with bar, ThreadPoolExecutor(workers, thread_name_prefix="fastload-adopt") as pool:
        futures = [
            pool.submit(_index_and_save, store, n, tmp_dir, out_store, prefix) for n in names
        ]
        results = []
        try:
            for f in futures:
                results.append(f.result())
                bar.update(1)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return results
