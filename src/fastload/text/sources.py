"""Where text documents come from and how they are read.

:func:`list_sources` resolves files, directories, globs and prefixes (on any URL
:mod:`fastload.storage` opens) into :class:`TextSource` files; :func:`read_documents`
yields the text field of every document of JSONL files (plain, ``.gz``, ``.zst``)
and parquet files, in file and line/row order, handing bad lines or rows to an
:class:`~fastload.shards.report.ErrorPolicy`; :func:`dataset_documents` does the same
for a ``datasets.Dataset``.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastload._args import renamed_keyword
from fastload.errors import MissingDependencyError, SourceDataError
from fastload.shards.report import ErrorPolicy

__all__ = [
    "NOT_DATA",
    "TEXT_EXTENSIONS",
    "TextSource",
    "dataset_documents",
    "dataset_records",
    "list_sources",
    "read_documents",
    "read_records",
    "source_store",
]

#: File names a directory, glob or prefix contributes (others are ignored).
TEXT_EXTENSIONS = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst",
                   ".json.zst", ".parquet")  # fmt: skip
_BATCH_DOCS = 1024  # rows read at a time from parquet files and datasets
_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class TextSource:
    """One input file: the store root it lives under and its name there."""

    root: str
    name: str

    @property
    def url(self) -> str:
        """The file's full URL or path."""
        return f"{self.root.rstrip('/')}/{self.name}" if self.root else self.name

    @property
    def format(self) -> str:
        """``"parquet"`` or ``"jsonl"``."""
        return "parquet" if self.name.endswith(".parquet") else "jsonl"


#: Files a directory or prefix listing never takes as data, though their extension is
#: a data extension: a tokenizer and model folder's JSON files (name them explicitly,
#: or by a glob, to read them).
NOT_DATA = frozenset({"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                      "added_tokens.json", "vocab.json", "config.json",
                      "generation_config.json", "manifest.json"})  # fmt: skip


def _is_text_file(name: str) -> bool:
    return name.lower().endswith(TEXT_EXTENSIONS)


def _is_data_file(name: str) -> bool:
    """A data file of a directory or prefix listing: by extension, but not
    :data:`NOT_DATA`."""
    return _is_text_file(name) and name.rsplit("/", 1)[-1].lower() not in NOT_DATA


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def list_sources(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
) -> list[TextSource]:
    """Resolve files, directories, globs and prefixes into input files, each
    source's files in name order. Raises :class:`SourceDataError` for a source that
    matches nothing."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    found: list[TextSource] = []
    for item in items:
        spec = os.fspath(item)
        found.extend(_list_local(spec) if _is_local(spec) else _list_remote(spec, storage_options))
    return found


def _list_local(spec: str) -> list[TextSource]:
    path = spec.removeprefix("file://")
    if any(c in path for c in _GLOB_CHARS):
        names = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
    elif os.path.isdir(path):
        names = sorted(
            os.path.join(d, f) for d, _, files in os.walk(path) for f in files if _is_data_file(f)
        )
    elif os.path.isfile(path):
        names = [path]
    else:
        raise SourceDataError("no such file or directory", path)
    if not names:
        raise SourceDataError("matches no JSONL or parquet files", path)
    return [TextSource("", n) for n in names]


def _list_remote(spec: str, storage_options: Mapping[str, Any] | None) -> list[TextSource]:
    from fastload.storage import open_store

    scheme, _, rest = spec.partition("://")
    bucket, _, key = rest.partition("/")
    pattern = None
    if any(c in key for c in _GLOB_CHARS):
        cut = min(key.find(c) for c in _GLOB_CHARS if c in key)
        base = key[:cut].rsplit("/", 1)[0] if "/" in key[:cut] else ""
        pattern = key[len(base) :].lstrip("/")
        key = base
    root = f"{scheme}://{bucket}/{key}".rstrip("/")
    if pattern is None and key and _is_text_file(key):
        parent, _, name = root.rpartition("/")
        store = open_store(parent, storage_options)
        if store.exists(name):
            return [TextSource(parent, name)]
    store = open_store(root, storage_options)
    if pattern is not None:  # an explicit pattern chooses the files itself
        names = [n for n in store.list() if _is_text_file(n) and fnmatch.fnmatchcase(n, pattern)]
    else:
        names = [n for n in store.list() if _is_data_file(n)]
    if not names:
        raise SourceDataError("matches no JSONL or parquet files", spec)
    return [TextSource(root, n) for n in sorted(names)]


def source_store(
    root: str, storage_options: Mapping[str, Any] | None, stores: dict[str, Any] | None
) -> Any:
    """The :class:`~fastload.storage.ObjectStore` for ``root``, reused from (and added
    to) ``stores`` when given, so callers can read its counters."""
    from fastload.storage import open_store

    if stores is None:
        return open_store(root, storage_options)
    if root not in stores:
        stores[root] = open_store(root, storage_options)
    return stores[root]


def _local_copy(
    src: TextSource,
    storage_options: Mapping[str, Any] | None,
    tmp_dir: str,
    stores: dict[str, Any] | None = None,
) -> str:
    """A local path holding ``src`` (remote files are downloaded into ``tmp_dir``)."""
    if not src.root:
        return src.name.removeprefix("file://")
    store = source_store(src.root, storage_options, stores)
    fd, path = tempfile.mkstemp(dir=tmp_dir, suffix="-" + os.path.basename(src.name))
    with os.fdopen(fd, "wb") as f:
        store.download(src.name, f)
    return path


def _zstd_lines(path: str, where: str) -> Iterator[bytes]:
    """Lines of a zstd file (one or more frames); a truncated last frame is an error
    (zstandard's stream reader would end quietly, losing the tail)."""
    try:
        import zstandard
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("zstandard", "text", "reading .zst sources") from exc
    dctx = zstandard.ZstdDecompressor()
    d, fed, rest = dctx.decompressobj(), False, b""
    with open(path, "rb") as raw:
        while chunk := raw.read(1 << 20):
            while chunk:
                fed = True
                try:
                    out = d.decompress(chunk)
                except zstandard.ZstdError as exc:
                    raise SourceDataError(f"cannot decompress ({exc})", where) from None
                chunk = b""
                if d.eof:  # a frame ended: what follows is the next frame
                    chunk, d, fed = d.unused_data, dctx.decompressobj(), False
                if out:
                    *lines, rest = (rest + out).split(b"\n")
                    yield from lines
    if fed:
        raise SourceDataError("cannot decompress (the zstd stream is truncated)", where)
    if rest:
        yield rest


def _jsonl_lines(path: str, where: str) -> Iterator[bytes]:
    """Lines of a plain, gzip (``.gz``) or zstd (``.zst``) JSONL file."""
    if where.lower().endswith(".zst"):
        yield from _zstd_lines(path, where)
        return
    opener: Any = gzip.open if where.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        yield from f


def _json_records(path: str, where: str, policy: ErrorPolicy) -> Iterator[tuple[str, str, Any]]:
    """``(item, place, record)`` of every record of a JSONL file, or of a JSON file
    holding one array of records (Alpaca's files): ``item`` names it for a report,
    ``place`` within the file ("line 3", "item 3"). A bad line goes to ``policy``."""
    base = os.path.basename(where)
    lines = _jsonl_lines(path, where)
    first = True
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if first and line.lstrip().startswith(b"["):
                yield from _array_records(b"".join([line, *lines]), where, base)
                return
            first = False
            try:
                doc = json.loads(line)
            except ValueError as exc:
                err = SourceDataError(f"line {lineno}: not valid JSON ({exc})", where)
                policy.bad(f"{base}:{lineno}", err)
                continue
            yield f"{base}:{lineno}", f"line {lineno}", doc
    except (OSError, EOFError) as exc:  # truncated or corrupt gzip streams
        # the records before the damage are kept; the rest of the file is skipped
        # (and reported) under on_error="skip", else the conversion stops here
        err = SourceDataError(f"cannot decompress or read after line {lineno} ({exc})", where)
        policy.bad(base, err)
    except SourceDataError as exc:  # a damaged .zst stream or JSON array file
        policy.bad(base, exc)


def _array_records(data: bytes, where: str, base: str) -> Iterator[tuple[str, str, Any]]:
    try:
        items = json.loads(data)
    except ValueError as exc:
        raise SourceDataError(f"a JSON array file that is not valid JSON ({exc})", where) from None
    if not isinstance(items, list):
        raise SourceDataError("starts with '[' but is not one JSON array", where)
    for i, doc in enumerate(items):
        yield f"{base}:item {i}", f"item {i}", doc


def _jsonl_documents(path: str, where: str, field: str, policy: ErrorPolicy) -> Iterator[str]:
    for item, place, doc in _json_records(path, where, policy):
        if not isinstance(doc, dict) or field not in doc:
            policy.bad(item, SourceDataError(f"{place}: no field {field!r}", where))
            continue
        value = doc[field]
        if not isinstance(value, str):
            kind = type(value).__name__
            err = SourceDataError(f"{place}: field {field!r} is a {kind}, not a string", where)
            policy.bad(item, err)
            continue
        yield value


def _parquet_documents(path: str, where: str, field: str, policy: ErrorPolicy) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("pyarrow", "text", "reading parquet sources") from exc
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise SourceDataError(f"not a readable parquet file ({exc})", where) from None
    if field not in pf.schema_arrow.names:
        raise SourceDataError(
            f"no column {field!r} (columns: {', '.join(pf.schema_arrow.names)})", where
        )
    row = 0
    try:
        batches = pf.iter_batches(columns=[field], batch_size=_BATCH_DOCS)
        for batch in batches:
            for value in batch.column(0).to_pylist():
                row += 1
                if not isinstance(value, str):
                    policy.bad(
                        f"{os.path.basename(where)}:row {row}",
                        SourceDataError(
                            f"row {row}: column {field!r} is {value!r:.40}, not a string", where
                        ),
                    )
                    continue
                yield value
    except SourceDataError:
        raise
    except Exception as exc:
        raise SourceDataError(f"row {row + 1}: cannot read ({exc})", where) from None


def _parquet_records(path: str, where: str) -> Iterator[tuple[str, str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("pyarrow", "text", "reading parquet sources") from exc
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise SourceDataError(f"not a readable parquet file ({exc})", where) from None
    base, row = os.path.basename(where), 0
    try:
        for batch in pf.iter_batches(batch_size=_BATCH_DOCS):
            for record in batch.to_pylist():
                row += 1
                yield f"{base}:row {row}", f"row {row}", record
    except Exception as exc:
        raise SourceDataError(f"row {row + 1}: cannot read ({exc})", where) from None


def read_records(
    sources: Sequence[TextSource],
    policy: ErrorPolicy | None = None,
    storage_options: Mapping[str, Any] | None = None,
    on_file: Callable[[TextSource], None] | None = None,
    stores: dict[str, Any] | None = None,
) -> Iterator[tuple[str, Any]]:
    """Yield ``(item, record)`` for every record (JSON object, array element or parquet
    row as a dict) of ``sources``, in file and line/row order; ``item`` names it
    ("file.jsonl:3") for errors and reports. Lines that are not JSON go to ``policy``."""
    policy = policy or ErrorPolicy("raise")
    tmp = tempfile.mkdtemp(prefix=".fastload-text-")
    try:
        for src in sources:
            if on_file is not None:
                on_file(src)
            path = _local_copy(src, storage_options, tmp, stores)
            try:
                if src.format == "parquet":
                    records = _parquet_records(path, src.url)
                else:
                    records = _json_records(path, src.url, policy)
                for item, _place, record in records:
                    yield item, record
            finally:
                if src.root:
                    os.unlink(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@renamed_keyword("field", "text_field")
def read_documents(
    sources: Sequence[TextSource],
    text_field: str = "text",
    policy: ErrorPolicy | None = None,
    storage_options: Mapping[str, Any] | None = None,
    on_file: Callable[[TextSource], None] | None = None,
    stores: dict[str, Any] | None = None,
) -> Iterator[str]:
    """Yield the ``text_field`` of every document of ``sources`` (``field=`` is its
    deprecated spelling), in file and line/row order. Bad lines or rows go to
    ``policy`` (default: raise, naming file and line)."""
    policy = policy or ErrorPolicy("raise")
    tmp = tempfile.mkdtemp(prefix=".fastload-text-")
    try:
        for src in sources:
            if on_file is not None:
                on_file(src)
            path = _local_copy(src, storage_options, tmp, stores)
            try:
                if src.format == "parquet":
                    yield from _parquet_documents(path, src.url, text_field, policy)
                else:
                    yield from _jsonl_documents(path, src.url, text_field, policy)
            finally:
                if src.root:
                    os.unlink(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dataset_documents(dataset: Any, field: str, policy: ErrorPolicy) -> Iterator[str]:
    if field not in getattr(dataset, "column_names", [field]):
        raise SourceDataError(f"no column {field!r} (columns: {dataset.column_names})", "Dataset")
    row = 0
    for batch in dataset.iter(batch_size=_BATCH_DOCS):
        for value in batch[field]:
            row += 1
            if not isinstance(value, str):
                policy.bad(
                    f"row {row}",
                    SourceDataError(f"row {row}: column {field!r} is not a string", "Dataset"),
                )
                continue
            yield value


def dataset_records(dataset: Any) -> Iterator[tuple[str, Any]]:
    """``(item, row as a dict)`` of every row of a ``datasets.Dataset``."""
    row = 0
    for batch in dataset.iter(batch_size=_BATCH_DOCS):
        names = list(batch)
        for values in zip(*(batch[n] for n in names), strict=True):
            row += 1
            yield f"row {row}", dict(zip(names, values, strict=True))
