"""Token shards of parquet files, built once per node by every process that asks.

The files' row groups are cut into :class:`Piece` s (:func:`plan_pieces`, a pure
function of the footers, so every process on the node plans the same pieces). Each
process that needs the tokens (:class:`TokenBuild`) claims the pieces nobody holds
(one lock file each: single flight per piece, released if the holder dies), reads
their row groups through the node cache (the next file downloads while this one
tokenizes), encodes them with :func:`~fastload.text.tokenize_pool.encode_pipeline`
and publishes each piece's ``(tokens, lengths)`` atomically. Local ranks thus split
the corpus between them instead of waiting for one of them. When every piece
exists, one process (under the dataset's lock) cuts them, in file and row order,
into token shards through :class:`~fastload.text.writer.TokenShardWriter` and
publishes the dataset with a directory rename; the pieces are deleted after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastload.cache.locks import EntryLocks
from fastload.errors import SourceDataError
from fastload.shards.report import progress_bar
from fastload.shards.writer import ShardWriter
from fastload.text.parquet_files import ParquetFile, ParquetFileCache, pyarrow_parquet
from fastload.text.tokenize_pool import encode_pipeline
from fastload.text.writer import TokenShardWriter

__all__ = ["Piece", "TokenBuild", "plan_pieces", "token_caches"]

_BATCH_DOCS = 1024  # documents handed to the tokenizer at once
_PIECES_PER_BUILD = 64  # enough to share a corpus among a node's local ranks
_DEADLINE_S = 7 * 24 * 3600.0  # another process may tokenize a large corpus


@dataclass(frozen=True)
class Piece:
    """Row groups ``[first_group, end_group)`` of file ``file``: ``rows`` documents."""

    file: int
    first_group: int
    end_group: int
    rows: int


def plan_pieces(files: Sequence[ParquetFile], pieces: int = _PIECES_PER_BUILD) -> list[Piece]:
    """Consecutive row groups of each file, grouped into pieces of about
    ``total rows / pieces`` rows (a row group is never split; a file's last piece may
    be smaller). Pure: the same footers give the same pieces in every process."""
    total = sum(f.num_rows for f in files)
    target = max(1, -(-total // max(1, pieces)))
    out: list[Piece] = []
    for k, f in enumerate(files):
        g0, rows = 0, 0
        for g, n in enumerate(f.row_groups):
            rows += n
            if rows >= target:
                out.append(Piece(k, g0, g + 1, rows))
                g0, rows = g + 1, 0
        if g0 < len(f.row_groups):
            out.append(Piece(k, g0, len(f.row_groups), rows))
    return out


def _texts(column: Any, field: str, first_row: int, where: str) -> list[str]:
    """The strings of a pyarrow column; a null or non-string value is a
    :class:`SourceDataError` naming the file and row."""
    pa = __import__("pyarrow")
    kind = column.type
    strings = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if strings and column.null_count == 0:
        return list(column.to_pylist())
    values = column.to_pylist()
    for j, value in enumerate(values):
        if not isinstance(value, str):
            row = first_row + j + 1
            raise SourceDataError(f"row {row}: column {field!r} is {value!r:.40}, not a string",
                                  where)  # fmt: skip
    return list(values)


class TokenBuild:
    """Build (or help build) the token shards of ``files`` at ``token_dir``.

    ``files``: the scanned sources, read through ``file_cache``; ``tokenizer``,
    ``field``, ``eos_id``, ``dtype`` and ``shard_size`` as for
    :func:`fastload.convert.text`; ``meta`` the manifest's ``source`` (completed with
    the token counts). ``threads`` encoding threads (0: one per core).
    """

    def __init__(
        self,
        files: Sequence[ParquetFile],
        file_cache: ParquetFileCache,
        token_dir: Path,
        *,
        tokenizer: Any,
        field: str,
        eos_id: int,
        dtype: np.dtype[Any],
        shard_size: int | str,
        meta: dict[str, Any],
        threads: int = 0,
        progress: bool = False,
    ) -> None:
        self.files = list(files)
        self.file_cache = file_cache
        self.token_dir = token_dir
        self.root = token_dir.parent
        self.key = token_dir.name
        self.pieces_dir = self.root / f".{self.key}.pieces"
        self.tokenizer = tokenizer
        self.field = field
        self.eos_id = eos_id
        self.dtype = dtype
        self.shard_size = shard_size
        self.meta = meta
        self.threads = threads
        self.progress = progress
        self.pieces = plan_pieces(self.files)
        #: pieces this process tokenized, and whether it published the dataset
        self.pieces_done = 0
        self.published = False

    # ----------------------------------------------------------------- state
    def _manifest(self) -> Path:
        return self.token_dir / "manifest.json"

    def _piece_path(self, i: int) -> Path:
        return self.pieces_dir / f"{i:06d}.npz"

    def _missing(self) -> list[int]:
        return [i for i in range(len(self.pieces)) if not self._piece_path(i).exists()]

    # ------------------------------------------------------------------ run
    def run(self) -> bool:
        """Tokenize the pieces nobody else holds, wait for the others, and publish
        the dataset unless another process did; returns whether this one published."""
        self.root.mkdir(parents=True, exist_ok=True)
        while not self._manifest().exists():
            self.pieces_dir.mkdir(exist_ok=True)
            missing = self._missing()
            if not missing:
                self._assemble()
                break
            locks = EntryLocks(self.pieces_dir)
            self._tokenize(missing, locks)
            for i in self._missing():  # held by other processes: wait for each
                if self._manifest().exists():
                    break
                deadline = time.monotonic() + _DEADLINE_S
                with locks.hold(f"{i:06d}", deadline, f"tokens of {self.files[0].url} ({i})"):
                    pass  # a holder that failed leaves its piece missing: the next round takes it
        if self.pieces_dir.exists() and self._manifest().exists():
            shutil.rmtree(self.pieces_dir, ignore_errors=True)
        return self.published

    def _tokenize(self, missing: list[int], locks: EntryLocks) -> None:
        claims: dict[int, contextlib.ExitStack] = {}
        claims_lock = threading.Lock()
        fetcher = ThreadPoolExecutor(1, thread_name_prefix="fastload-parquet-fetch")

        def claim(i: int) -> bool:
            stack = contextlib.ExitStack()
            if not stack.enter_context(locks.try_hold(f"{i:06d}")) or self._piece_path(i).exists():
                stack.close()
                return False
            with claims_lock:
                claims[i] = stack
            return True

        def release(i: int) -> None:
            with claims_lock:
                stack = claims.pop(i, None)
            if stack is not None:
                stack.close()

        def claimed() -> Iterator[int]:
            for i in missing:
                if self._manifest().exists():
                    return
                if claim(i):
                    yield i

        wanted = {self.pieces[i].file for i in missing}
        fetched: set[int] = set()

        def fetch_ahead(k: int) -> None:
            # the next file this process will likely read downloads while this one
            # tokenizes (through the node cache: one download per node, whoever asks)
            later = [f for f in sorted(wanted) if f > k and f not in fetched]
            if later:
                fetched.add(later[0])
                fetcher.submit(self.file_cache.open, later[0])

        def batches() -> Iterator[tuple[tuple[int, bool], list[str]]]:
            for i in claimed():
                k = self.pieces[i].file
                if k not in fetched:
                    fetched.add(k)
                    fetch_ahead(k)
                yield from self._piece_batches(i)
                yield (i, True), []

        parts: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        bar = progress_bar(len(missing), "tokenizing", self.progress)
        bar.unit = "piece"
        try:
            for (i, last), tokens, lengths in encode_pipeline(
                self.tokenizer, batches(), self.eos_id, self.dtype, threads=self.threads
            ):
                tok_parts, len_parts = parts.setdefault(i, ([], []))
                if tokens.size:
                    tok_parts.append(tokens)
                    len_parts.append(lengths)
                if last:
                    del parts[i]
                    self._publish(i, tok_parts, len_parts)
                    release(i)
                    bar.update(1)
        finally:
            bar.close()
            fetcher.shutdown(wait=True, cancel_futures=True)
            for i in list(claims):
                release(i)

    def _piece_batches(self, i: int) -> Iterator[tuple[tuple[int, bool], list[str]]]:
        pa = __import__("pyarrow")
        piece = self.pieces[i]
        f = self.files[piece.file]
        try:
            data = self.file_cache.open(piece.file)
            pf = pyarrow_parquet().ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        except SourceDataError:
            raise
        except Exception as exc:
            raise SourceDataError(f"not a readable parquet file ({exc})", f.url) from None
        if self.field not in pf.schema_arrow.names:
            raise SourceDataError(
                f"no column {self.field!r} (columns: {', '.join(pf.schema_arrow.names)})", f.url
            )
        row = int(sum(f.row_groups[: piece.first_group]))
        groups = list(range(piece.first_group, piece.end_group))
        try:
            stream = pf.iter_batches(batch_size=_BATCH_DOCS, row_groups=groups,
                                     columns=[self.field])  # fmt: skip
            for batch in stream:
                texts = _texts(batch.column(0), self.field, row, f.url)
                row += len(texts)
                yield (i, False), texts
        except SourceDataError:
            raise
        except Exception as exc:
            raise SourceDataError(f"row {row + 1}: cannot read ({exc})", f.url) from None

    def _publish(self, i: int, tok_parts: list[np.ndarray], len_parts: list[np.ndarray]) -> None:
        tokens = np.concatenate(tok_parts) if tok_parts else np.zeros(0, self.dtype)
        lengths = np.concatenate(len_parts) if len_parts else np.zeros(0, np.int64)
        if self._manifest().exists():
            return  # published meanwhile: the pieces are no longer wanted
        fd, tmp = tempfile.mkstemp(dir=self.pieces_dir, suffix=".npz.part")
        try:
            with os.fdopen(fd, "wb") as out:
                np.savez(out, tokens=tokens, lengths=lengths)
            os.replace(tmp, self._piece_path(i))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.pieces_done += 1

    def _assemble(self) -> None:
        """Under the dataset's lock: the pieces, in order, as token shards published at
        ``token_dir`` (unless another process did it while this one waited)."""
        locks = EntryLocks(self.root)
        with locks.hold(self.key, time.monotonic() + _DEADLINE_S, f"tokens of {self.key}"):
            if self._manifest().exists():
                return
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.key}.", dir=self.root))
            try:
                meta = dict(self.meta)
                writer = ShardWriter(str(tmp / "ds"), self.shard_size, None, meta)
                try:
                    shards = TokenShardWriter(writer, self.dtype)
                    for i in range(len(self.pieces)):
                        with np.load(self._piece_path(i)) as z:
                            shards.add(z["tokens"], z["lengths"])
                    shards.close()
                    meta.update(tokens=int(sum(shards.shard_tokens)),
                                documents=int(sum(shards.shard_docs)),
                                shard_tokens=shards.shard_tokens,
                                shard_docs=shards.shard_docs)  # fmt: skip
                    writer.source = meta
                    writer.close()
                except BaseException:
                    writer.abort()
                    raise
                os.replace(tmp / "ds", self.token_dir)
                self.published = True
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


def token_caches(cache_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The token datasets published under ``<cache_dir>/text/tokens`` (by
    :class:`~fastload.ParquetTokenDataset`): for each, its key, tokens, documents,
    shards, source files and bytes on disk; ``problem`` names an unreadable manifest.
    Unfinished builds (pieces, temporary directories) are counted as ``pending``."""
    root = Path(cache_dir) / "text" / "tokens"
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir():
            continue
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        if d.name.startswith("."):
            out.append({"key": d.name, "pending": True, "bytes": size})
            continue
        row: dict[str, Any] = {"key": d.name, "pending": False, "bytes": size}
        try:
            doc = json.loads((d / "manifest.json").read_text())
            src = doc["source"]
            row.update(tokens=int(src.get("tokens", 0)), documents=int(src.get("documents", 0)),
                       shards=len(doc["shards"]), sources=len(src.get("sources", [])),
                       dtype=str(src.get("dtype")))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError) as exc:
            row["problem"] = f"unreadable manifest ({exc})"
        out.append(row)
    return out
