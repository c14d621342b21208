"""Small synthetic text for demos, tests and benchmarks, made offline: a corpus of
made-up words with a Zipf-like frequency (:func:`make_corpus`) and a byte-level BPE
tokenizer trained on it (:func:`train_tokenizer`), as ``fastload.convert.synthetic``
makes image datasets in their original layouts."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from fastload.errors import MissingDependencyError

__all__ = ["make_corpus", "train_tokenizer"]

_SYLLABLES = ("ka", "ri", "to", "na", "mo", "shi", "ra", "le", "vu", "po", "de", "la", "ne",
              "ti", "so", "ba", "gu", "fe", "zo", "mi")  # fmt: skip


def make_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 20..400 made-up words, deterministic in ``seed``."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
    weights = [1.0 / (r + 1) for r in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randint(20, 400))) + "." for _ in range(n)]


def train_tokenizer(
    corpus: Sequence[str], path: str | os.PathLike[str], vocab_size: int = 4096
) -> Any:
    """A byte-level BPE tokenizer trained offline on ``corpus`` (no hub), saved at
    ``path``; raises :class:`MissingDependencyError` without the ``text`` extra."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("tokenizers", "text", "training a tokenizer") from exc

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(os.fspath(path))
    return tok
