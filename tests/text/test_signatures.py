"""The text API refuses what it cannot honour (issue 24): explicit signatures, a
``TypeError`` (Python's own) before any I/O, and the old spellings kept for one
release with a ``DeprecationWarning``."""

from __future__ import annotations

import inspect
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
from text_helpers import write_jsonl, write_parquet

import fastload
from fastload import CacheConfig
from fastload.datasets.source import ShardSource
from fastload.text import ParquetDataset, ParquetTokenDataset, TokenDataset, TokenSource

KW = inspect.Parameter.KEYWORD_ONLY
MISSING = "/no/such/place/nothing.parquet"  # any I/O would raise something else


def _kinds(obj: Any) -> dict[str, inspect._ParameterKind]:
    return {n: p.kind for n, p in inspect.signature(obj).parameters.items()}


@pytest.fixture
def tokens(tmp_path: Path, corpus: list[str], tokenizer_path: str) -> str:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:40])
    out = str(tmp_path / "tokens")
    fastload.convert.text(str(tmp_path / "a.jsonl"), out, tokenizer=tokenizer_path)
    return out


@pytest.fixture
def parquet(tmp_path: Path, corpus: list[str]) -> str:
    return write_parquet(str(tmp_path / "pq" / "a.parquet"), corpus[:40])


def test_signatures_take_the_source_by_position_and_the_rest_by_keyword() -> None:
    for cls in (TokenDataset, TokenSource, ParquetDataset, ParquetTokenDataset):
        kinds = _kinds(cls)
        first, *rest = kinds
        assert first == "url", cls
        assert all(kinds[n] is KW for n in rest), (cls, kinds)
    kinds = _kinds(fastload.convert.text)
    assert list(kinds)[:2] == ["sources", "out"]
    assert all(k is KW for k in list(kinds.values())[2:])
    assert "text_field" in kinds
    assert "field" not in kinds
    # TokenSource takes exactly what ShardSource takes
    assert list(_kinds(TokenSource)) == list(inspect.signature(ShardSource).parameters)


@pytest.mark.parametrize(
    "argument",
    [
        {"shuffle": True},
        {"seed": 3},
        {"world": fastload.World.single()},
        {"seq_len": 8},
        {"text_field": "body"},
        {"eos_id": 2},
    ],
)
def test_rows_refuse_what_only_token_windows_use(argument: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(argument))}'"):
        ParquetDataset(MISSING, **argument)


@pytest.mark.parametrize(
    "argument",
    [{"cache_limit": "1GB"}, {"columns": ["text"]}, {"ram_limit": "1GB"}, {"fetch": None}],
)
def test_token_windows_refuse_what_they_cannot_honour(argument: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(argument))}'"):
        ParquetTokenDataset(MISSING, tokenizer="t.json", seq_len=8, cache_dir="/c", **argument)


def test_parquet_dataset_with_a_tokenizer_still_works_with_a_warning(
    tmp_path: Path, parquet: str, tokenizer_path: str
) -> None:
    cache = tmp_path / "cache"
    with pytest.warns(DeprecationWarning, match=r"write ParquetTokenDataset\(url, tokenizer="):
        ds = ParquetDataset(
            parquet, tokenizer=tokenizer_path, seq_len=8, cache_dir=cache, shuffle=False
        )
    assert type(ds) is ParquetTokenDataset
    # the old positional order (url, columns, cache_dir, cache_limit, storage_options)
    with pytest.warns(DeprecationWarning, match="ParquetTokenDataset"):
        old = ParquetDataset(
            parquet, None, cache, None, tokenizer=tokenizer_path, seq_len=8, shuffle=False
        )
    assert old.token_dir == ds.token_dir
    assert old[0]["input_ids"].tolist() == ds[0]["input_ids"].tolist()
    # what token windows never used is refused now, not dropped
    deprecated = pytest.warns(DeprecationWarning, match="write ParquetTokenDataset")
    with deprecated, pytest.raises(TypeError, match="cache_limit"):
        ParquetDataset(parquet, tokenizer=tokenizer_path, seq_len=8, cache_dir=cache,
                       cache_limit="1GB", shuffle=False)  # fmt: skip
    deprecated = pytest.warns(DeprecationWarning, match="write ParquetTokenDataset")
    with deprecated, pytest.raises(TypeError, match="columns"):
        ParquetDataset(parquet, ["text"], cache, tokenizer=tokenizer_path, seq_len=8, shuffle=False)


def test_rows_positional_arguments_still_work_with_a_warning(tmp_path: Path, parquet: str) -> None:
    with pytest.warns(DeprecationWarning, match="write columns=..., cache_dir=..."):
        ds = ParquetDataset(parquet, ["text"], tmp_path / "c")
    assert ds[0].keys() == {"text"}
    assert ds.cache_dir == str(tmp_path / "c")
    copy = pickle.loads(pickle.dumps(ds))
    assert type(copy) is ParquetDataset
    assert copy[1] == ds[1]


def test_rows_honour_the_cache_config(tmp_path: Path, parquet: str) -> None:
    ds = ParquetDataset(parquet, cache_config=CacheConfig(cache_dir=str(tmp_path / "c")))
    assert ds.cache_dir == str(tmp_path / "c")
    limited = ParquetDataset(
        parquet, cache_dir=tmp_path / "c", cache_config=CacheConfig(cache_limit="64MB")
    )
    assert limited._files.cache_config.cache_limit == 64 * 10**6


def test_token_dataset_seq_len_by_position_still_works_with_a_warning(tokens: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = TokenDataset(tokens, seq_len=8, shuffle=False)
    with pytest.warns(DeprecationWarning, match=r"TokenDataset\(\): passing seq_len by position"):
        old = TokenDataset(tokens, 8, shuffle=False)
    assert old.num_windows == new.num_windows
    with pytest.warns(DeprecationWarning, match="write seq_len=..., cache_dir=..."):
        TokenDataset(tokens, 8, None, shuffle=False)
    with pytest.raises(TypeError, match="seq_len"):
        TokenDataset(tokens, shuffle=False)  # type: ignore[call-arg]


def test_token_dataset_refuses_cache_arguments_beside_a_source(tokens: str) -> None:
    source = TokenSource(tokens)
    with pytest.raises(TypeError, match="cache_dir beside source="):
        TokenDataset(tokens, seq_len=8, source=source, cache_dir="/somewhere", shuffle=False)
    assert TokenDataset(tokens, seq_len=8, source=source, shuffle=False).source is source


def test_token_source_positional_arguments_still_work_with_a_warning(tokens: str) -> None:
    with pytest.warns(DeprecationWarning, match="write storage_options=..."):
        src = TokenSource(tokens, None)
    assert src.shard_tokens == TokenSource(tokens).shard_tokens


def test_convert_text_old_spellings_still_work_with_a_warning(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    src = write_jsonl(str(tmp_path / "a.jsonl"), corpus[:10], field="body")
    with pytest.warns(DeprecationWarning, match="is deprecated") as caught:
        old = fastload.convert.text(src, str(tmp_path / "o1"), tokenizer_path, field="body")
    messages = " ".join(str(w.message) for w in caught)
    assert "write tokenizer=..." in messages
    assert "write text_field=" in messages
    new = fastload.convert.text(src, str(tmp_path / "o2"), tokenizer=tokenizer_path,
                                text_field="body")  # fmt: skip
    assert (
        (old.tokens, old.documents)
        == (new.tokens, new.documents)
        == (new.tokens, 10 - new.empty_documents)
    )
    with pytest.raises(TypeError, match="got both 'field' and 'text_field'"):
        fastload.convert.text(src, str(tmp_path / "o3"), tokenizer=tokenizer_path,
                              field="body", text_field="body")  # fmt: skip
    assert not (tmp_path / "o3").exists()


def test_token_shuffle_default_changes_with_a_warning_naming_the_caller(
    tokens: str, parquet: str, tokenizer_path: str, tmp_path: Path
) -> None:
    # one shuffle default for every iterable dataset (StreamingDataset's True): the token
    # datasets keep today's unshuffled order for a release and say so where they are made
    with pytest.warns(DeprecationWarning, match=r"shuffle's default becomes True") as seen:
        ds = TokenDataset(tokens, seq_len=8)
    assert ds.shuffle is False
    assert seen[0].filename == __file__  # the warning points at this call, not inside
    assert list(ds.rank_plan(fastload.World.single())) == list(range(ds.num_windows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TokenDataset(tokens, seq_len=8, shuffle=False).shuffle is False
        assert TokenDataset(tokens, seq_len=8, shuffle=True).shuffle is True
    with pytest.warns(DeprecationWarning, match=r"ParquetTokenDataset\(\): shuffle") as seen:
        pds = ParquetTokenDataset(
            parquet, tokenizer=tokenizer_path, seq_len=8, cache_dir=str(tmp_path / "c")
        )
    assert pds.shuffle is False
    assert seen[0].filename == __file__
