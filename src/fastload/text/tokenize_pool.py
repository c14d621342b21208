"""Tokenizing as a pipeline: batches of documents read in one thread, encoded by a
pool of threads, handed on in order (:func:`encode_pipeline`).

``Tokenizer.encode_batch`` runs in Rust without the GIL (and, unless
``TOKENIZERS_PARALLELISM`` is off or the process was forked after the tokenizer's
own thread pool was used, over every core), so while the pool encodes, the reader
thread can download and decode the next parquet row group and the caller can write
the last batch's tokens. Several batches are encoded at once, so the cores stay busy
even where the tokenizer's own parallelism is off. Ids become one flat numpy array
per batch without a Python loop over documents (:func:`encode_ids`).

Used by both writers of token streams from text: the first pass of
:class:`~fastload.ParquetTokenDataset` (:mod:`fastload.text.parquet_build`) and
``fastload.convert.text``, which feeds it ``(len(b), b) for b in
batched_documents(docs, 1024)`` and writes the same shards, byte for byte, as the
one-batch loop :func:`fastload.text.writer.encode_documents`.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from fastload.errors import ConfigError

__all__ = ["default_threads", "encode_ids", "encode_pipeline"]

T = TypeVar("T")
_END = object()


_MAX_THREADS = 16  # past this, batches in flight cost RAM and the tokenizer's pool is busy


def default_threads() -> int:
    """Encoding threads: one per core this process may run on, at least 2 (so the
    conversion of one batch overlaps the encoding of the next) and at most 16 (each
    ``encode_batch`` spreads over every core by itself unless the tokenizer's
    parallelism is off)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(2, min(cores, _MAX_THREADS))


def encode_ids(
    tokenizer: Any, texts: list[str], eos_id: int, dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``texts`` (one ``encode_batch``; ``encode_batch_fast`` where the
    tokenizer has it: the same ids without character offsets) into ``(tokens,
    lengths)``: every document's ids followed by ``eos_id``, flat in ``dtype``, and
    each document's length (EOS included). Documents without tokens are left out.

    Raises :class:`ConfigError` when an id does not fit ``dtype``.
    """
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    # a document with no tokens (an empty text) is left out, not written as a lone EOS,
    # as fastload.convert.text does (fastload.text.writer.encode_documents)
    ids = [i for i in (e.ids for e in encode(texts)) if i]
    n = len(ids)
    sizes = np.fromiter(map(len, ids), dtype=np.int64, count=n)
    lengths = sizes + 1
    total = int(lengths.sum())
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total - n)
    top = max(int(flat.max()) if flat.size else 0, eos_id if n else 0)
    if top > np.iinfo(dtype).max:
        raise ConfigError(f"token id {top} does not fit in {np.dtype(dtype).name}")
    tokens = np.empty(total, dtype=dtype)
    eos_at = np.cumsum(lengths) - 1
    keep = np.ones(total, dtype=bool)
    keep[eos_at] = False
    tokens[keep] = flat
    tokens[eos_at] = eos_id
    return tokens, lengths


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def encode_pipeline(
    tokenizer: Any,
    batches: Iterable[tuple[T, list[str]]],
    eos_id: int,
    dtype: np.dtype[Any],
    *,
    threads: int = 0,
    ahead: int = 0,
) -> Iterator[tuple[T, np.ndarray, np.ndarray]]:
    """Yield ``(tag, tokens, lengths)`` (:func:`encode_ids`) for every ``(tag, texts)``
    of ``batches``, in their order.

    ``batches`` is iterated in a thread of its own (so reading overlaps encoding);
    ``threads`` encode (default :func:`default_threads`), at most ``ahead`` batches
    (default ``threads + 2``) are read or encoded ahead of the caller. An exception of
    the reader or of an encoder is raised here, in order; closing the iterator early
    stops the reader and the pool.
    """
    threads = threads or default_threads()
    ahead = ahead or threads + 2
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fastload-tokenize")
    pending: queue.Queue[Any] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def read() -> None:
        try:
            for tag, texts in batches:
                if stop.is_set():
                    return
                fut = pool.submit(encode_ids, tokenizer, texts, eos_id, dtype)
                if not _put(pending, (tag, fut), stop):
                    fut.cancel()
                    return
        except BaseException as exc:  # handed to the caller, in order
            _put(pending, exc, stop)
        else:
            _put(pending, _END, stop)

    reader = threading.Thread(target=read, name="fastload-tokenize-read", daemon=True)
    reader.start()
    try:
        while True:
            item = pending.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            tag, fut = item
            tokens, lengths = fut.result()
            yield tag, tokens, lengths
    finally:
        stop.set()
        while reader.is_alive():
            try:
                left = pending.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(left, tuple) and isinstance(left[1], Future):
                left[1].cancel()
        reader.join()
        pool.shutdown(wait=True, cancel_futures=True)
