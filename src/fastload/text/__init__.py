"""Text: tokenizers, text sources, token shards and the datasets over them.

- :func:`text` (also ``fastload.convert.text``) tokenizes JSONL or parquet documents
  into token shards (:mod:`.sources` lists and reads the documents);
- :class:`TokenDataset` serves fixed-length windows of token shards through the node
  cache (:class:`TokenLayout`, :class:`TokenSource`, :func:`collate_packed`);
- :class:`ParquetDataset` reads the rows of existing parquet files, and
  :class:`ParquetTokenDataset` serves token windows of them, tokenized once per node.

The names resolve lazily, so ``fastload.convert.text`` loads no dataset module (and
no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "ParquetDataset": "fastload.text.parquet",
    "ParquetFile": "fastload.text.parquet",
    "ParquetTokenDataset": "fastload.text.parquet",
    "TEXT_EXTENSIONS": "fastload.text.sources",
    "TextConvertReport": "fastload.text.sources",
    "TextSource": "fastload.text.sources",
    "TokenDataset": "fastload.text.tokens",
    "TokenLayout": "fastload.text.tokens",
    "TokenSource": "fastload.text.tokens",
    "collate_packed": "fastload.text.tokens",
    "eos_id_of": "fastload.text.sources",
    "list_sources": "fastload.text.sources",
    "load_tokenizer": "fastload.text.sources",
    "read_documents": "fastload.text.sources",
    "scan_parquet": "fastload.text.parquet",
    "text": "fastload.text.sources",
    "token_dtype": "fastload.text.sources",
    "tokenizer_fingerprint": "fastload.text.sources",
}

__all__ = [
    "TEXT_EXTENSIONS",
    "ParquetDataset",
    "ParquetFile",
    "ParquetTokenDataset",
    "TextConvertReport",
    "TextSource",
    "TokenDataset",
    "TokenLayout",
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
    from fastload.text.parquet import (
        ParquetDataset,
        ParquetFile,
        ParquetTokenDataset,
        scan_parquet,
    )
    from fastload.text.sources import (
        TEXT_EXTENSIONS,
        TextConvertReport,
        TextSource,
        eos_id_of,
        list_sources,
        load_tokenizer,
        read_documents,
        text,
        token_dtype,
        tokenizer_fingerprint,
    )
    from fastload.text.tokens import TokenDataset, TokenLayout, TokenSource, collate_packed
