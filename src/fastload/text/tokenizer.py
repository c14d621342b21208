"""The tokenizer side of text: loading a Hugging Face ``tokenizers`` tokenizer, its
fingerprint (equal fingerprints tokenize identically), its EOS id and the storage
type its ids need."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from fastload.errors import ConfigError, MissingDependencyError

__all__ = ["eos_id_of", "load_tokenizer", "token_dtype", "tokenizer_fingerprint"]

_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")


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
