"""Fixtures for the text tests: a generated corpus, a tokenizer trained on it
offline, and writers for the source formats (JSONL plain/gz/zst, parquet)."""

from __future__ import annotations

import os

import pytest
from text_helpers import make_corpus, train_tokenizer

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """300 generated documents of varied length (a few empty)."""
    return make_corpus(300, seed=1)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> str:
    """A small BPE ``tokenizer.json`` trained on ``corpus``, with ``</s>`` as EOS."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(corpus, str(path))
    return str(path)
