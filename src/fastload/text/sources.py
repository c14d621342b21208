"""``fastload.convert.text``: tokenize text documents into token shards.

Documents come from JSONL files (plain, ``.gz``, ``.zst``), parquet files, a
directory, glob or prefix of them (on any URL :mod:`fastload.storage` opens), or a
``datasets.Dataset``. Each document is tokenized with a Hugging Face ``tokenizers``
tokenizer (batch encoding, parallel in the tokenizer's own threads) and followed by
the EOS id. The concatenated stream is written as token shards: each shard is a
WebDataset tar holding one sample with a ``tokens`` member (a flat little-endian
uint16/uint32 array) and a ``docs`` member (int64 offsets of the documents within
the shard, ``0`` first and the token count last). Documents never straddle shards.
The shards go through :class:`fastload.ShardWriter`, so they get index sidecars,
checksums and a manifest (``kind: "tokens"``) like image shards, and the manifest is
written last: a failed or interrupted run publishes nothing.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.config import parse_size
from fastload.errors import ConfigError, MissingDependencyError, SourceDataError
from fastload.shards.report import ConvertReport, ErrorPolicy, finish, progress_bar
from fastload.shards.writer import ShardWriter

__all__ = [
    "TEXT_EXTENSIONS",
    "TextConvertReport",
    "TextSource",
    "eos_id_of",
    "list_sources",
    "load_tokenizer",
    "read_documents",
    "source_store",
    "text",
    "token_dtype",
    "tokenizer_fingerprint",
]

#: File names a directory, glob or prefix contributes (others are ignored).
TEXT_EXTENSIONS = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst",
                   ".json.zst", ".parquet")  # fmt: skip
_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
_BATCH_DOCS = 1024
_GLOB_CHARS = "*?["


# ------------------------------------------------------------------ tokenizer
def load_tokenizer(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` path (or one as it is).

    Raises :class:`MissingDependencyError` without the ``text`` extra and
    :class:`ConfigError` for an unreadable file.
    """
    try:
        import tokenizers
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("tokenizers", "text", "fastload.convert.text") from exc
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer
    path = os.fspath(tokenizer)
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise ConfigError(f"{path}: not a readable tokenizer.json ({exc})") from None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable hash of the tokenizer's whole definition (vocabulary, merges,
    normalizer, special tokens): equal fingerprints tokenize identically."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()[:32]


def eos_id_of(tokenizer: Any, eos_id: int | None = None, path: str | None = None) -> int:
    """The EOS id: ``eos_id`` if given, else ``eos_token`` of a ``tokenizer_config.json``
    beside ``path``, else the first well-known EOS token in the vocabulary.

    Raises :class:`ConfigError` when none is found or ``eos_id`` is not in the vocabulary.
    """
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if eos_id is not None:
        if not 0 <= int(eos_id) < vocab:
            raise ConfigError(f"eos_id {eos_id} is outside the tokenizer's vocabulary of {vocab}")
        return int(eos_id)
    if path is not None:
        config = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
        if os.path.isfile(config):
            try:
                with open(config, encoding="utf-8") as f:
                    token = json.load(f).get("eos_token")
            except (OSError, ValueError):
                token = None
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
                return int(tokenizer.token_to_id(token))
    for token in _EOS_CANDIDATES:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    raise ConfigError(
        "the tokenizer has no EOS token (none of " + ", ".join(_EOS_CANDIDATES) + "); "
        "pass eos_id= (fastload convert text --eos-id N)"
    )


def token_dtype(dtype: str, vocab_size: int) -> np.dtype[Any]:
    """The little-endian storage type: ``"auto"`` picks uint16 when every id fits.

    Raises :class:`ConfigError` for an unknown dtype or a vocabulary that does not fit.
    """
    if dtype == "auto":
        dtype = "uint16" if vocab_size <= 2**16 else "uint32"
    if dtype not in ("uint16", "uint32"):
        raise ConfigError(f"dtype must be 'auto', 'uint16' or 'uint32', got {dtype!r}")
    if dtype == "uint16" and vocab_size > 2**16:
        raise ConfigError(f"a vocabulary of {vocab_size} ids does not fit in uint16; use uint32")
    return np.dtype("<u2" if dtype == "uint16" else "<u4")


# -------------------------------------------------------------------- sources
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


def _is_text_file(name: str) -> bool:
    return name.lower().endswith(TEXT_EXTENSIONS)


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
            os.path.join(d, f) for d, _, files in os.walk(path) for f in files if _is_text_file(f)
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
    names = [n for n in store.list() if _is_text_file(n)]
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
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


# ------------------------------------------------------------------ documents
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


def _jsonl_documents(path: str, where: str, field: str, policy: ErrorPolicy) -> Iterator[str]:
    try:
        for lineno, line in enumerate(_jsonl_lines(path, where), 1):
            if not line.strip():
                continue
            item = f"{os.path.basename(where)}:{lineno}"
            try:
                doc = json.loads(line)
            except ValueError as exc:
                policy.bad(item, SourceDataError(f"line {lineno}: not valid JSON ({exc})", where))
                continue
            if not isinstance(doc, dict) or field not in doc:
                policy.bad(item, SourceDataError(f"line {lineno}: no field {field!r}", where))
                continue
            value = doc[field]
            if not isinstance(value, str):
                policy.bad(
                    item,
                    SourceDataError(
                        f"line {lineno}: field {field!r} is a {type(value).__name__}, not a string",
                        where,
                    ),
                )
                continue
            yield value
    except (OSError, EOFError) as exc:  # truncated or corrupt gzip streams
        raise SourceDataError(f"cannot decompress or read ({exc})", where) from None


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


def read_documents(
    sources: Sequence[TextSource],
    field: str = "text",
    policy: ErrorPolicy | None = None,
    storage_options: Mapping[str, Any] | None = None,
    on_file: Callable[[TextSource], None] | None = None,
    stores: dict[str, Any] | None = None,
) -> Iterator[str]:
    """Yield the ``field`` of every document of ``sources``, in file and line/row
    order. Bad lines or rows go to ``policy`` (default: raise, naming file and line)."""
    policy = policy or ErrorPolicy("raise")
    tmp = tempfile.mkdtemp(prefix=".fastload-text-")
    try:
        for src in sources:
            if on_file is not None:
                on_file(src)
            path = _local_copy(src, storage_options, tmp, stores)
            try:
                if src.format == "parquet":
                    yield from _parquet_documents(path, src.url, field, policy)
                else:
                    yield from _jsonl_documents(path, src.url, field, policy)
            finally:
                if src.root:
                    os.unlink(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dataset_documents(dataset: Any, field: str, policy: ErrorPolicy) -> Iterator[str]:
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


def _batches(docs: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for d in docs:
        batch.append(d)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


# --------------------------------------------------------------------- stream
def encode_documents(
    tokenizer: Any, docs: Iterable[str], eos_id: int, dtype: np.dtype[Any]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Tokenize ``docs`` in batches: yields ``(tokens, lengths)`` per batch, each
    document's ids followed by ``eos_id``, ``tokens`` in ``dtype``.

    Raises :class:`ConfigError` when an id does not fit ``dtype``.
    """
    limit = np.iinfo(dtype).max
    eos = np.array([eos_id], dtype=np.int64)
    for batch in _batches(docs, _BATCH_DOCS):
        encodings = tokenizer.encode_batch(batch)
        parts: list[np.ndarray] = []
        lengths = np.empty(len(encodings), dtype=np.int64)
        for k, enc in enumerate(encodings):
            ids = np.asarray(enc.ids, dtype=np.int64)
            parts.append(ids)
            parts.append(eos)
            lengths[k] = ids.size + 1
        flat = np.concatenate(parts)
        if flat.size and int(flat.max()) > limit:
            raise ConfigError(f"token id {int(flat.max())} does not fit in {dtype.name}")
        yield flat.astype(dtype), lengths


class TokenShardWriter:
    """Cut a document-ordered token stream into token shards of about ``shard_size``
    bytes (documents are not split) and write them through a :class:`ShardWriter`."""

    def __init__(self, writer: ShardWriter, dtype: np.dtype[Any]) -> None:
        self.writer = writer
        self.dtype = dtype
        self.limit = max(1, writer.shard_size // dtype.itemsize)
        self._parts: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._held = 0
        self.shard_tokens: list[int] = []
        self.shard_docs: list[int] = []

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append whole documents (``lengths`` tokens each, concatenated in ``tokens``)."""
        ends = np.cumsum(lengths)
        i, pos, n = 0, 0, int(lengths.size)
        while i < n:
            room = self.limit - self._held
            k = int(np.searchsorted(ends[i:] - pos, room, side="right"))  # documents that fit
            if k == 0:
                if self._held:
                    self._flush()
                    continue
                k = 1  # a document longer than a shard gets a shard of its own
            end = int(ends[i + k - 1])
            self._parts.append(tokens[pos:end])
            self._lengths.append(lengths[i : i + k])
            self._held += end - pos
            i, pos = i + k, end
            if i < n or self._held >= self.limit:
                self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        tokens = np.concatenate(self._parts).astype(self.dtype, copy=False)
        lengths = np.concatenate(self._lengths)
        offsets = np.zeros(lengths.size + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        n = len(self.shard_tokens)
        self.writer.write(
            {"__key__": f"{n:06d}", "tokens": tokens.tobytes(), "docs": offsets.tobytes()}
        )
        self.shard_tokens.append(int(tokens.size))
        self.shard_docs.append(int(lengths.size))
        self._parts, self._lengths, self._held = [], [], 0

    def close(self) -> None:
        """Write the last, partly filled shard."""
        self._flush()


@dataclass
class TextConvertReport(ConvertReport):
    """A text conversion's report: tokens and documents besides the shards."""

    @property
    def tokens(self) -> int:
        """Tokens written (EOS included)."""
        return int(self.manifest.source.get("tokens", 0))

    @property
    def documents(self) -> int:
        """Documents written."""
        return int(self.manifest.source.get("documents", 0))

    def summary(self) -> str:
        """A few human-readable lines: counts, size, and each skipped item."""
        m = self.manifest
        lines = [
            f"wrote {self.tokens} tokens ({m.source.get('dtype')}) of {self.documents} "
            f"documents in {len(m.shards)} shard(s), {m.total_bytes} bytes, to {m.url}"
        ]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} bad input(s):")
            lines.extend(f"  {s.item}: {s.path}: {s.reason}" for s in self.skipped)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``fastload convert text --json``."""
        return {**super().to_dict(), "tokens": self.tokens, "documents": self.documents,
                "dtype": self.manifest.source.get("dtype")}  # fmt: skip


def text(
    sources: Any,
    out: str,
    tokenizer: Any,
    *,
    field: str = "text",
    eos_id: int | None = None,
    dtype: str = "auto",
    shard_size: int | str = "256MB",
    storage_options: Mapping[str, Any] | None = None,
    on_error: str = "raise",
    progress: bool = False,
    overwrite: bool = False,
    stores: dict[str, Any] | None = None,
) -> TextConvertReport:
    """Tokenize documents into token shards at ``out``; returns the report.

    ``sources``: a JSONL/parquet file, directory, glob or prefix (or a list of
    them), on any URL fastload opens, or a ``datasets.Dataset``; ``field`` is the
    text column. ``tokenizer``: a ``tokenizer.json`` path or a
    ``tokenizers.Tokenizer``. Every document is followed by ``eos_id`` (default: the
    tokenizer's EOS token). ``dtype`` ``"auto"`` stores uint16 when the vocabulary
    fits. ``on_error="skip"`` leaves out bad lines/rows and lists them in the report.

    Raises :class:`SourceDataError` naming the file and line of a bad document (with
    ``on_error="raise"``), :class:`ConfigError` for bad settings or no EOS, and
    :class:`OutputExistsError` for an existing dataset at ``out`` without
    ``overwrite``; nothing is published then. With ``overwrite`` the old dataset stays
    readable until the new manifest replaces it (a failed run leaves it as it was),
    and its shards are deleted after (:class:`~fastload.ShardWriter`'s safe overwrite).
    ``stores``, if given, receives the object stores the sources were read through
    (by root URL), whose ``stats()`` count the bytes fetched.
    """
    tok = load_tokenizer(tokenizer)
    tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
    eos = eos_id_of(tok, eos_id, tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    np_dtype = token_dtype(dtype, vocab)
    if parse_size(shard_size, "shard_size") < np_dtype.itemsize:
        raise ConfigError(f"shard_size {shard_size!r} is smaller than one token")
    policy = ErrorPolicy(on_error)
    is_dataset = hasattr(sources, "column_names") and hasattr(sources, "iter")
    files: list[TextSource] = [] if is_dataset else list_sources(sources, storage_options)
    source_meta: dict[str, Any] = {
        "kind": "tokens",
        "dtype": np_dtype.name,
        "vocab_size": vocab,
        "eos_id": eos,
        "field": field,
        "tokenizer": tokenizer_fingerprint(tok),
        "sources": [s.url for s in files] if files else ["<datasets.Dataset>"],
    }
    # refuses an existing dataset unless overwrite, before any tokenizing; the old one
    # stays published until writer.close() replaces its manifest
    writer = ShardWriter(out, shard_size, storage_options, source_meta, overwrite=overwrite)
    bar = progress_bar(len(files) if files else len(sources), "tokenizing", progress)
    try:
        bar.unit = "file" if files else "doc"
        if is_dataset:
            docs: Iterable[str] = _dataset_documents(sources, field, policy)
        else:
            docs = read_documents(
                files,
                field,
                policy,
                storage_options,
                on_file=lambda _src: bar.update(1),
                stores=stores,
            )
        shards = TokenShardWriter(writer, np_dtype)
        for tokens, lengths in encode_documents(tok, docs, eos, np_dtype):
            shards.add(tokens, lengths)
            if is_dataset:
                bar.update(lengths.size)
        shards.close()
        source_meta.update(
            tokens=int(sum(shards.shard_tokens)),
            documents=int(sum(shards.shard_docs)),
            shard_tokens=shards.shard_tokens,
            shard_docs=shards.shard_docs,
        )
        writer.source = source_meta
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    report = finish(writer, policy, progress)
    return TextConvertReport(report.manifest, report.skipped)
