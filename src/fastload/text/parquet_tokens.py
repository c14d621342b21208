"""``ParquetTokenDataset``: token windows of existing parquet files, tokenized once
per node.

The same windows as :class:`~fastload.TokenDataset` over the documents of
``text_field`` (file and row order, EOS after each), **tokenized once per node**: the
first process on the node writes the token shards into
``<cache_dir>/text/tokens/<key>/`` (one process, under a lock; published by a
directory rename), keyed by each source's URL, size and footer checksum, the
tokenizer's fingerprint, the field, EOS and dtype. Every later epoch, rank and job
on the node reads those tokens, and never the parquet files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastload._args import changing_default
from fastload.cache.external import hold_tokens
from fastload.cache.locks import EntryLocks
from fastload.cache.shard_cache import CachedShard
from fastload.errors import ConfigError
from fastload.sampling import World
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.storage import ObjectStore
from fastload.text.parquet_files import ParquetFile, scan_parquet
from fastload.text.tokens import SHUFFLE_WHY, TokenDataset, TokenSource

__all__ = ["ParquetTokenDataset"]

_TOKENIZE_DEADLINE_S = 7 * 24 * 3600.0  # another process may tokenize a large corpus


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
    a ``tokenizers.Tokenizer``. The first process on the node tokenizes the files into
    ``<cache_dir>/text/tokens/<key>/`` (``dtype``, ``shard_size`` and ``progress`` as
    for :func:`fastload.convert.text`); every later one maps those token shards in
    place (counted under the cache's cap, which may evict them when no dataset holds them).
    ``shuffle``, ``seed``, ``world``, ``drop_last``, ``window_shards``,
    ``prefetch_shards``, ``position_ids``, ``cu_seqlens`` and resume as for
    TokenDataset. Everything but ``url`` is passed by keyword.

    ``source_remote_bytes()`` counts the bytes this process read from the parquet
    files' store (0 once the tokens exist). Raises :class:`ConfigError` on bad
    arguments, :class:`ShardFormatError` for a file that is not parquet.
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
    ) -> None:
        from fastload.text.tokenizer import (
            eos_id_of,
            load_tokenizer,
            token_dtype,
            tokenizer_fingerprint,
        )

        if cache_dir is None:
            raise ConfigError("ParquetTokenDataset needs cache_dir (the node cache)")
        if shuffle is None:
            shuffle = changing_default("ParquetTokenDataset", "shuffle", False, True, SHUFFLE_WHY)
        self.source_stores: dict[str, ObjectStore] = {}
        files = scan_parquet(url, storage_options, self.source_stores)
        tok = load_tokenizer(tokenizer)
        tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
        eos = eos_id_of(tok, eos_id, tok_path)
        np_dtype = token_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))
        key_doc = {
            "files": [[f.url, f.size, f.footer_checksum] for f in files],
            "tokenizer": tokenizer_fingerprint(tok),
            "field": text_field,
            "eos_id": eos,
            "dtype": np_dtype.name,
        }
        key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:40]
        root = Path(os.fspath(cache_dir)) / "text" / "tokens"
        self.token_dir = root / key
        self.tokenized_here = False
        # under the cache's one cap, pinned while this dataset lives (fastload.cache.external)
        self._cache_pin = hold_tokens(
            cache_dir, self.token_dir, sum(f.size for f in files), np_dtype.itemsize,
            lambda: self._tokenize(files, root, key, tok, text_field, eos, np_dtype.name,
                                   shard_size, storage_options, progress),
        )  # fmt: skip
        source = _LocalTokenSource(str(self.token_dir), max_open_shards=6)
        super().__init__(
            str(self.token_dir), seq_len=seq_len, shuffle=shuffle, seed=seed, world=world,
            drop_last=drop_last, window_shards=window_shards, prefetch_shards=prefetch_shards,
            position_ids=position_ids, cu_seqlens=cu_seqlens, source=source,
        )  # fmt: skip
        self.files = files

    def _tokenize(
        self,
        files: list[ParquetFile],
        root: Path,
        key: str,
        tok: Any,
        field: str,
        eos: int,
        dtype: str,
        shard_size: int | str,
        storage_options: Mapping[str, Any] | None,
        progress: bool,
    ) -> None:
        from fastload.text.converter import text

        root.mkdir(parents=True, exist_ok=True)
        locks = EntryLocks(root)
        with locks.hold(key, time.monotonic() + _TOKENIZE_DEADLINE_S, f"tokens of {key}"):
            if (self.token_dir / "manifest.json").exists():
                return  # another process on the node did it while we waited
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
            try:
                text([f.url for f in files], str(tmp / "ds"), tokenizer=tok, text_field=field,
                     eos_id=eos, dtype=dtype, shard_size=shard_size,
                     storage_options=storage_options, progress=progress,
                     stores=self.source_stores)  # fmt: skip
                os.replace(tmp / "ds", self.token_dir)
                self.tokenized_here = True
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def source_remote_bytes(self) -> int:
        """Bytes this process fetched from the parquet files' store(s), counted by
        their :class:`~fastload.storage.ObjectStore`: footers at start-up, and the
        whole files when it tokenized them (nothing once the node has the tokens)."""
        return int(sum(s.stats().bytes_read for s in self.source_stores.values()))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["source_stores"] = {}  # counters are per process
        return state
