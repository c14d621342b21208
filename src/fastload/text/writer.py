"""Token shards: documents tokenized in batches (:func:`encode_documents`) and the
document-ordered token stream cut into shards of about ``shard_size`` bytes
(:class:`TokenShardWriter`), written through a :class:`~fastload.ShardWriter`.

Each token shard is a WebDataset tar holding one sample with a ``tokens`` member (a
flat little-endian uint16/uint32 array) and a ``docs`` member (int64 offsets of the
documents within the shard, ``0`` first and the token count last). Documents never
straddle shards. A dataset of chat examples has a third member, ``mask``: one uint8
of flags per token (:mod:`fastload.text.packing`: trained, padding); shards without
it are read as all trained, no padding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fastload.errors import ConfigError
from fastload.shards.writer import ShardWriter

__all__ = ["TokenShardWriter", "batched_documents", "encode_documents"]

_BATCH_DOCS = 1024  # documents handed to the tokenizer at once


def batched_documents(docs: Iterable[str], n: int) -> Iterator[list[str]]:
    """``docs`` in lists of ``n`` (the last may be shorter)."""
    batch: list[str] = []
    for d in docs:
        batch.append(d)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_documents(
    tokenizer: Any,
    docs: Iterable[str],
    eos_id: int,
    dtype: np.dtype[Any],
    counts: dict[str, int] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Tokenize ``docs`` one batch at a time, in this thread (the reference that
    :func:`fastload.text.tokenize_pool.encode_pipeline` matches, and its pool
    replaces in ``fastload.convert.text``): yields ``(tokens, lengths)`` per batch, each
    document's ids followed by ``eos_id``, ``tokens`` in ``dtype``. A document with
    no tokens (an empty text) is left out, not written as a lone EOS, and counted in
    ``counts["empty_documents"]``.

    Raises :class:`ConfigError` when an id does not fit ``dtype``.
    """
    limit = np.iinfo(dtype).max
    eos = np.array([eos_id], dtype=np.int64)
    for batch in batched_documents(docs, _BATCH_DOCS):
        encodings = tokenizer.encode_batch(batch)
        parts: list[np.ndarray] = []
        lengths = np.empty(len(encodings), dtype=np.int64)
        empty = 0
        for enc in encodings:
            ids = np.asarray(enc.ids, dtype=np.int64)
            if not ids.size:
                empty += 1
                continue
            parts.append(ids)
            parts.append(eos)
            lengths[len(parts) // 2 - 1] = ids.size + 1
        if counts is not None:
            counts["empty_documents"] = counts.get("empty_documents", 0) + empty
        lengths = lengths[: len(parts) // 2]
        if not parts:
            continue
        flat = np.concatenate(parts)
        if flat.size and int(flat.max()) > limit:
            raise ConfigError(f"token id {int(flat.max())} does not fit in {dtype.name}")
        yield flat.astype(dtype), lengths


class TokenShardWriter:
    """Cut a document-ordered token stream into token shards of about ``shard_size``
    bytes (documents are not split) and write them through a :class:`ShardWriter`."""

    def __init__(self, writer: ShardWriter, dtype: np.dtype[Any], flags: bool = False) -> None:
        self.writer = writer
        self.dtype = dtype
        self.flags = flags  # write a ``mask`` member (flags per token) in every shard
        self._flags: list[np.ndarray] = []
        self.limit = max(1, writer.shard_size // dtype.itemsize)
        self._parts: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._held = 0
        self.shard_tokens: list[int] = []
        self.shard_docs: list[int] = []

    def add(self, tokens: np.ndarray, lengths: np.ndarray, flags: np.ndarray | None = None) -> None:
        """Append whole documents (``lengths`` tokens each, concatenated in ``tokens``;
        ``flags``, one uint8 per token, when the writer was made with ``flags``)."""
        if self.flags != (flags is not None):
            raise ConfigError("TokenShardWriter: flags must be given exactly when made with flags")
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
            if flags is not None:
                self._flags.append(flags[pos:end])
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
        sample = {"__key__": f"{n:06d}", "tokens": tokens.tobytes(), "docs": offsets.tobytes()}
        if self.flags:
            sample["mask"] = np.concatenate(self._flags).astype(np.uint8, copy=False).tobytes()
        self.writer.write(sample)
        self.shard_tokens.append(int(tokens.size))
        self.shard_docs.append(int(lengths.size))
        self._parts, self._lengths, self._flags, self._held = [], [], [], 0

    def close(self) -> None:
        """Write the last, partly filled shard."""
        self._flush()
