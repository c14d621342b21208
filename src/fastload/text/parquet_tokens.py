"""``ParquetTokenDataset``: token windows of existing parquet files, tokenized once
per node.

The same windows as :class:`~fastload.TokenDataset` over the documents of
``text_field`` (file and row order, EOS after each), **tokenized once per node**:
the processes on the node that construct it share the row groups among them, each
tokenizing on every core with the download overlapped
(:mod:`fastload.text.parquet_build`), and one publishes the token shards at
``<cache_dir>/text/tokens/<key>/`` (a directory rename), keyed by each source's
canonical URL (local paths resolved), size and footer checksum, the tokenizer's
fingerprint, the field, EOS and dtype. Every later epoch, rank and job on the node
reads those tokens, and never the parquet files. Every argument is checked before
any file is read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastload._args import changing_default
from fastload.cache.external import hold_tokens
from fastload.cache.shard_cache import CachedShard
from fastload.config import CacheConfig, parse_size
from fastload.errors import ConfigError, SourceDataError
from fastload.sampling import World
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.storage import ObjectStore
from fastload.text.parquet_build import TokenBuild
from fastload.text.parquet_files import DEFAULT_PATTERN, ParquetFileCache, scan_parquet
from fastload.text.tokens import SHUFFLE_WHY, TokenDataset, TokenSource

__all__ = ["ParquetTokenDataset"]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_arguments(
    *,
    seq_len: Any,
    text_field: Any,
    seed: Any,
    world: Any,
    window_shards: Any,
    prefetch_shards: Any,
    threads: Any,
    shuffle: Any,
) -> None:
    """The values TokenDataset would refuse only after the tokens exist."""
    if not _is_int(seq_len) or seq_len < 1:
        raise ConfigError(f"seq_len must be a positive int, got {seq_len!r}")
    if not isinstance(text_field, str) or not text_field:
        raise ConfigError(f"text_field must be a column name, got {text_field!r}")
    if not _is_int(seed):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    if world is not None and not isinstance(world, World):
        raise ConfigError(f"world must be a fastload.World or None, got {world!r}")
    if not _is_int(window_shards) or window_shards < 1:
        raise ConfigError(f"window_shards must be a positive int, got {window_shards!r}")
    if not _is_int(prefetch_shards) or prefetch_shards < 0:
        raise ConfigError(f"prefetch_shards must be >= 0, got {prefetch_shards!r}")
    if not _is_int(threads) or threads < 0:
        raise ConfigError(f"threads must be >= 0 (0: one per core), got {threads!r}")
    if shuffle is not None and not isinstance(shuffle, bool):
        raise ConfigError(f"shuffle must be True, False or None, got {shuffle!r}")


class _LocalTokenSource(TokenSource):
    """Token shards published in the node's cache directory: mapped in place (they
    were verified when written), not copied into the disk tier again."""

    def shard(self, shard: int) -> CachedShard:
        self._check_pid()
        with self._lock:
            cached = self._open.get(shard)
            if cached is not None:
                self._open.move_to_end(shard)
                return cached
        import mmap

        info = self.manifest.shards[shard]
        path = Path(self.url.removeprefix("file://")) / info.name
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cached = CachedShard(self.cache.key(self.dataset_id, info), memoryview(mapping), path,
                             None, mapping)  # fmt: skip
        with self._lock:
            self._open[shard] = cached
            while len(self._open) > self.max_open_shards:
                _, old = self._open.popitem(last=False)
                old.close()
        return cached

    def prefetch(self, shards: Sequence[int]) -> None:
        """Nothing to stage: the shards are local files."""


class ParquetTokenDataset(TokenDataset):
    """:class:`~fastload.TokenDataset` windows of ``seq_len`` tokens over the documents
    of existing parquet files, tokenized once per node.

    ``url``: a parquet file, directory, glob or prefix (or a list), files in name
    order; ``text_field`` is the text column, each document followed by ``eos_id``
    (default: the tokenizer's EOS token). ``tokenizer``: a ``tokenizer.json`` path or
    a ``tokenizers.Tokenizer``. Data files are those whose name matches ``pattern``
    (default ``*.parquet``). The processes on the node that construct it at once
    (local ranks) share the tokenizing, row groups split between them, each over
    ``threads`` encoding threads (0: one per core), into
    ``<cache_dir>/text/tokens/<key>/`` (``dtype``, ``shard_size`` and ``progress`` as
    for :func:`fastload.convert.text`); every later one maps those token shards in
    place (counted under the cache's cap, which may evict them when no dataset holds
    them; the remote parquet files pass through the node cache's disk tier).
    ``shuffle``, ``seed``, ``world``, ``drop_last``, ``window_shards``,
    ``prefetch_shards``, ``position_ids``, ``cu_seqlens`` and resume as for
    TokenDataset. Everything but ``url`` is passed by keyword.

    ``source_remote_bytes()`` counts the bytes this process read from the parquet
    files' store (0 once the tokens exist). Raises :class:`ConfigError` on bad
    arguments (before any tokenizing) and when ``seq_len`` is longer than the corpus,
    :class:`SourceDataError` for a missing column or a non-string value (naming the
    file and row), :class:`ShardFormatError` for a file that is not parquet.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        tokenizer: Any,
        seq_len: int,
        cache_dir: str | os.PathLike[str],
        text_field: str = "text",
        eos_id: int | None = None,
        dtype: str = "auto",
        shard_size: int | str = "256MB",
        progress: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        pattern: str = DEFAULT_PATTERN,
        threads: int = 0,
    ) -> None:
        from fastload.text.tokenizer import (
            eos_id_of,
            load_tokenizer,
            token_dtype,
            tokenizer_fingerprint,
        )

        # every argument is checked before any file is read or tokenized
        if cache_dir is None:
            raise ConfigError("ParquetTokenDataset needs cache_dir (the node cache)")
        _check_arguments(seq_len=seq_len, text_field=text_field, seed=seed, world=world,
                         window_shards=window_shards, prefetch_shards=prefetch_shards,
                         threads=threads, shuffle=shuffle)  # fmt: skip
        if shuffle is None:
            shuffle = changing_default("ParquetTokenDataset", "shuffle", False, True, SHUFFLE_WHY)
        tok = load_tokenizer(tokenizer)
        tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
        eos = eos_id_of(tok, eos_id, tok_path)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        np_dtype = token_dtype(dtype, vocab)
        if parse_size(shard_size, "shard_size") < np_dtype.itemsize:
            raise ConfigError(f"shard_size {shard_size!r} is smaller than one token")
        self.source_stores: dict[str, ObjectStore] = {}
        files = scan_parquet(url, storage_options, self.source_stores, pattern)
        for f in files:
            if f.columns and text_field not in f.columns:
                raise SourceDataError(
                    f"no column {text_field!r} (columns: {', '.join(f.columns)})", f.url
                )
        fingerprint = tokenizer_fingerprint(tok)
        key_doc = {
            "files": [[f.canonical_url, f.size, f.footer_checksum] for f in files],
            "tokenizer": fingerprint,
            "field": text_field,
            "eos_id": eos,
            "dtype": np_dtype.name,
        }
        key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:40]
        root = Path(os.path.abspath(os.fspath(cache_dir))) / "text" / "tokens"
        self.token_dir = root / key
        self.tokenized_here = False
        self.pieces_tokenized_here = 0
        self._fetched = 0

        def tokenize() -> None:
            # every process that asks joins the first pass (fastload.text.parquet_build)
            meta = {"kind": "tokens", "dtype": np_dtype.name, "vocab_size": vocab,
                    "eos_id": eos, "field": text_field, "tokenizer": fingerprint,
                    "sources": [f.url for f in files]}  # fmt: skip
            file_cache = ParquetFileCache(
                files, storage_options, CacheConfig(cache_dir=os.fspath(cache_dir)), None, 4
            )
            try:
                build = TokenBuild(files, file_cache, self.token_dir, tokenizer=tok,
                                   field=text_field, eos_id=eos, dtype=np_dtype,
                                   shard_size=shard_size, meta=meta, threads=threads,
                                   progress=progress)  # fmt: skip
                self.tokenized_here = build.run()
                self.pieces_tokenized_here = build.pieces_done
                self._fetched = file_cache.remote_bytes()
            finally:
                file_cache.close()

        # under the cache's one cap, pinned while this dataset lives (fastload.cache.external)
        self._cache_pin = hold_tokens(
            cache_dir, self.token_dir, sum(f.size for f in files), np_dtype.itemsize, tokenize
        )
        source = _LocalTokenSource(str(self.token_dir), max_open_shards=6)
        super().__init__(
            str(self.token_dir), seq_len=seq_len, shuffle=shuffle, seed=seed, world=world,
            drop_last=drop_last, window_shards=window_shards, prefetch_shards=prefetch_shards,
            position_ids=position_ids, cu_seqlens=cu_seqlens, source=source,
        )  # fmt: skip
        if self.layout.num_windows == 0:
            raise ConfigError(
                f"seq_len={seq_len} is longer than the corpus: {url} holds "
                f"{self.layout.num_tokens} tokens (EOS included) and a window needs "
                f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more documents"
            )
        self.files = files

    def source_remote_bytes(self) -> int:
        """Bytes this process fetched from the parquet files' store(s), counted by
        their :class:`~fastload.storage.ObjectStore`: footers at start-up, and the
        whole files when it tokenized them (nothing once the node has the tokens)."""
        footers = sum(s.stats().bytes_read for s in self.source_stores.values())
        return int(footers + self._fetched)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["source_stores"] = {}  # counters are per process
        return state
