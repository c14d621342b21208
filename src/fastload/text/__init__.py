"""Text: tokenizers, text sources, token shards and the datasets over them.

- :func:`text` (also ``fastload.convert.text``, :mod:`.converter`) tokenizes JSONL or
  parquet documents (:mod:`.sources` lists and reads them) with a Hugging Face
  tokenizer (:mod:`.tokenizer`) into token shards (:mod:`.writer`); with
  ``chat=True`` or a :class:`ChatConfig`, chat and instruction records formatted by a
  chat template (:mod:`.chat`) with a per-token loss mask, packed into blocks
  (:mod:`.packing`);
- :class:`TokenDataset` serves fixed-length windows of token shards through the node
  cache (:class:`TokenLayout`, :class:`TokenSource`, :func:`collate_packed`);
- :class:`ParquetDataset` reads the rows of existing parquet files, and
  :class:`ParquetTokenDataset` serves token windows of them, tokenized once per node
  (:mod:`.parquet`, :mod:`.parquet_files`, :mod:`.parquet_tokens`);
- :mod:`.synthetic` makes a small corpus and trains a tokenizer on it, offline (the
  text demo, tests and benchmarks use it).

The names resolve lazily, so ``fastload.convert.text`` loads no dataset module (and
no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "ChatConfig": "fastload.text.chat",
    "ParquetDataset": "fastload.text.parquet",
    "ParquetFile": "fastload.text.parquet_files",
    "ParquetTokenDataset": "fastload.text.parquet_tokens",
    "TEXT_EXTENSIONS": "fastload.text.sources",
    "TextConvertReport": "fastload.text.converter",
    "TextSource": "fastload.text.sources",
    "TokenDataset": "fastload.text.tokens",
    "TokenLayout": "fastload.text.tokens",
    "TokenShardWriter": "fastload.text.writer",
    "TokenSource": "fastload.text.tokens",
    "collate_packed": "fastload.text.tokens",
    "eos_id_of": "fastload.text.tokenizer",
    "list_sources": "fastload.text.sources",
    "load_tokenizer": "fastload.text.tokenizer",
    "read_documents": "fastload.text.sources",
    "scan_parquet": "fastload.text.parquet_files",
    "text": "fastload.text.converter",
    "token_dtype": "fastload.text.tokenizer",
    "tokenizer_fingerprint": "fastload.text.tokenizer",
}

__all__ = [
    "TEXT_EXTENSIONS",
    "ChatConfig",
    "ParquetDataset",
    "ParquetFile",
    "ParquetTokenDataset",
    "TextConvertReport",
    "TextSource",
    "TokenDataset",
    "TokenLayout",
    "TokenShardWriter",
    "TokenSource",
    "collate_packed",
    "eos_id_of",
    "list_sources",
    "load_tokenizer",
    "read_documents",
    "scan_parquet",
    "text",
    "token_dtype",
    "tokenizer_fingerprint",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastload.text' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # pragma: no cover
    from fastload.text.chat import ChatConfig
    from fastload.text.converter import TextConvertReport, text
    from fastload.text.parquet import ParquetDataset
    from fastload.text.parquet_files import ParquetFile, scan_parquet
    from fastload.text.parquet_tokens import ParquetTokenDataset
    from fastload.text.sources import TEXT_EXTENSIONS, TextSource, list_sources, read_documents
    from fastload.text.tokenizer import (
        eos_id_of,
        load_tokenizer,
        token_dtype,
        tokenizer_fingerprint,
    )
    from fastload.text.tokens import TokenDataset, TokenLayout, TokenSource, collate_packed
    from fastload.text.writer import TokenShardWriter
