"""Rough edges of ``ParquetTokenDataset`` (each test fails on the code before issue 26):
arguments checked before any work, canonical cache keys, data files by extension or
pattern, ``seq_len`` longer than the corpus, ``fastload cache stats`` on its cache
directory, a null text named by file and row."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from text_helpers import reference_stream, write_parquet

from fastload.cli import main as cli_main
from fastload.errors import ConfigError, SourceDataError
from fastload.text import ParquetDataset, ParquetTokenDataset

EOS = 2


def parquet_dir(root: Path, corpus: list[str], files: int = 3, row_group_size: int = 50) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    step = -(-len(corpus) // files)
    for k in range(files):
        write_parquet(str(root / f"part-{k:03d}.parquet"), corpus[k * step : (k + 1) * step],
                      row_group_size=row_group_size)  # fmt: skip
    return root


def windows(ds: Any) -> list[tuple[int, ...]]:
    return [tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))]


def test_cache_stats_on_the_cache_dir_of_local_parquet(
    tmp_path: Path, corpus: list[str], tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    ds = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=cache,
                             shuffle=False)  # fmt: skip
    assert cli_main(["cache", "stats", "--cache-dir", str(cache), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["key"] for t in doc["token_datasets"]] == [ds.token_dir.name]
    assert doc["token_datasets"][0]["tokens"] == ds.layout.num_tokens
    assert cli_main(["cache", "stats", "--cache-dir", str(cache)]) == 0
    # the documents with tokens: an empty one is left out (no lone EOS)
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    kept = sum(1 for e in tok.encode_batch(corpus) if e.ids)
    assert kept < len(corpus)  # the corpus has empty documents
    assert f"{ds.layout.num_tokens} tokens of {kept} documents" in capsys.readouterr().out


BAD_VALUES = [
    ({"seq_len": 0}, "seq_len"),
    ({"seq_len": 8.0}, "seq_len"),
    ({"window_shards": 0}, "window_shards"),
    ({"prefetch_shards": -1}, "prefetch_shards"),
    ({"world": "node0"}, "world"),
    ({"shuffle": "yes"}, "shuffle"),
    ({"dtype": "int8"}, "dtype"),
    ({"shard_size": "1B", "dtype": "uint16"}, "shard_size"),
    ({"text_field": "body"}, "no column 'body'"),
    ({"eos_id": 10**6}, "eos_id"),
    ({"threads": -1}, "threads"),
]


@pytest.mark.parametrize(("bad", "match"), BAD_VALUES)
def test_every_argument_is_checked_before_any_tokenizing(
    tmp_path: Path, corpus: list[str], tokenizer_path: str, bad: dict[str, Any], match: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"tokenizer": tokenizer_path, "seq_len": 8, "cache_dir": cache,
                              "shuffle": False, **bad}  # fmt: skip
    with pytest.raises((ConfigError, SourceDataError), match=match):
        ParquetTokenDataset(str(root), **kwargs)
    assert not (cache / "text" / "tokens").exists()  # nothing was tokenized


def test_a_misspelt_keyword_of_the_old_spelling_is_a_type_error_before_work(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="txt_field"):
            ParquetDataset(str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=cache,
                           txt_field="text")  # fmt: skip
        with pytest.raises(ConfigError, match="seq_len"):
            ParquetDataset(str(root), tokenizer=tokenizer_path, seq_len=-3, cache_dir=cache)
    with pytest.raises(TypeError, match="txt_field"):
        ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=cache,
                            txt_field="text")  # type: ignore[call-arg]  # fmt: skip
    assert not (cache / "text" / "tokens").exists()


def test_a_relative_and_an_absolute_path_tokenize_once(
    tmp_path: Path, corpus: list[str], tokenizer_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    first = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=cache,
                                shuffle=False)  # fmt: skip
    assert first.tokenized_here
    monkeypatch.chdir(tmp_path)  # the process's working directory, not a client
    again = ParquetTokenDataset("pq", tokenizer=tokenizer_path, seq_len=8, cache_dir="cache",
                                shuffle=False)  # fmt: skip
    assert not again.tokenized_here
    assert again.token_dir == first.token_dir
    also = ParquetTokenDataset("./pq/", tokenizer=tokenizer_path, seq_len=8,
                               cache_dir=str(cache), shuffle=False)  # fmt: skip
    assert not also.tokenized_here
    assert len([p for p in (cache / "text" / "tokens").iterdir() if p.is_dir()]) == 1


def test_data_files_by_extension_or_pattern(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus[:200], files=2)
    # a tokenizer and its config beside the data are not data
    (root / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (root / "README.md").write_text("about this corpus")
    ds = ParquetTokenDataset(str(root), tokenizer=str(root / "tokenizer.json"), seq_len=8,
                             cache_dir=tmp_path / "c", shuffle=False)  # fmt: skip
    assert [Path(f.name).name for f in ds.files] == ["part-000.parquet", "part-001.parquet"]
    # an explicit pattern picks other names, e.g. parquet files ending in .pq
    other = tmp_path / "pqx"
    other.mkdir()
    write_parquet(str(other / "a.pq"), corpus[:100])
    write_parquet(str(other / "b.pq"), corpus[100:200])
    write_parquet(str(other / "skip.parquet"), corpus[200:])
    pq_ds = ParquetTokenDataset(str(other / "*"), tokenizer=tokenizer_path, seq_len=8,
                                cache_dir=tmp_path / "c", shuffle=False,
                                pattern="*.pq")  # fmt: skip
    assert [Path(f.name).name for f in pq_ds.files] == ["a.pq", "b.pq"]
    assert windows(pq_ds) == windows(ds)
    rows = ParquetDataset(str(other / "*"), pattern="*.pq")
    assert len(rows) == 200
    with pytest.raises(ConfigError, match=r"no file name matches '\*\.arrow'"):
        ParquetTokenDataset(str(other / "*"), tokenizer=tokenizer_path, seq_len=8,
                            cache_dir=tmp_path / "c", shuffle=False, pattern="*.arrow")  # fmt: skip


def test_seq_len_longer_than_the_corpus_says_so(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus[:3], files=1)
    total = len(reference_stream(tokenizer_path, corpus[:3], EOS))
    with pytest.raises(
        ConfigError, match=rf"seq_len=100000 is longer than the corpus.*{total} tokens"
    ):
        ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=100_000,
                            cache_dir=tmp_path / "c", shuffle=False)  # fmt: skip
    ok = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=total - 1,
                             cache_dir=tmp_path / "c", shuffle=False)  # fmt: skip
    assert len(ok) == 1


def test_a_null_text_is_named_by_file_and_row(tmp_path: Path, tokenizer_path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "pq"
    root.mkdir()
    texts: list[str | None] = ["a b c"] * 30
    texts[17] = None
    pq.write_table(pa.table({"text": texts}), root / "bad.parquet", row_group_size=10)
    with pytest.raises(SourceDataError, match=r"bad\.parquet: row 18: column 'text' is None"):
        ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=4,
                            cache_dir=tmp_path / "c", shuffle=False)  # fmt: skip
    assert not list((tmp_path / "c" / "text" / "tokens").glob("[!.]*"))  # nothing published
