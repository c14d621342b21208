"""Rough edges of the text conversion and the CLI (issue 26, Build item 5): a tokenizer
folder's JSON beside the data is not data, a truncated ``.gz`` under ``--skip-bad`` is
reported and skipped, an empty document is left out (not a lone EOS) and counted, a
non-UTF-8 line is named by file and line (or skipped and reported), ``seq_len`` longer
than the corpus is a clear error, and ``fastload --help`` lists ``convert text``."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from test_convert_text import EOS, read_stream
from text_helpers import converted_stream, write_jsonl

import fastload
from fastload.cli import main
from fastload.convert import SourceDataError
from fastload.errors import ConfigError
from fastload.text.sources import list_sources


def test_a_tokenizer_beside_the_data_is_not_data(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    src = tmp_path / "src"
    corpus = [d for d in corpus if d.strip()]
    write_jsonl(str(src / "a.jsonl"), corpus[:20])
    shutil.copy(tokenizer_path, src / "tokenizer.json")
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (src / "b.json").write_text(json.dumps([{"text": d} for d in corpus[20:30]]))
    assert [Path(s.url).name for s in list_sources(str(src))] == ["a.jsonl", "b.json"]
    report = fastload.convert.text(str(src), str(tmp_path / "out"), tokenizer=tokenizer_path)
    assert report.documents == 30
    # named explicitly, or by a pattern, such a file is read (and here is not records)
    assert [Path(s.url).name for s in list_sources(str(src / "tokenizer.json"))] == [
        "tokenizer.json"
    ]


def test_a_tokenizer_under_a_prefix_is_not_data(
    seaweed, tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    url = seaweed.new_url("rough")
    store_root = url.rstrip("/")
    from fastload.storage import open_store

    store = open_store(store_root, seaweed.storage_options)
    store.write_bytes(
        "a.jsonl", "".join(json.dumps({"text": d}) + "\n" for d in corpus[:5]).encode()
    )
    store.write_bytes("tokenizer.json", Path(tokenizer_path).read_bytes())
    names = [s.name for s in list_sources(store_root, seaweed.storage_options)]
    assert names == ["a.jsonl"]


def test_truncated_gzip_with_skip_bad_is_reported_and_skipped(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    corpus = [d for d in corpus if d.strip()]
    data = gzip.compress(("\n".join(json.dumps({"text": d}) for d in corpus)).encode())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    write_jsonl(str(tmp_path / "src" / "u.jsonl"), corpus[:7])
    report = fastload.convert.text(
        str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=tokenizer_path, on_error="skip"
    )
    assert [s.item for s in report.skipped] == ["t.jsonl.gz"]
    assert "cannot decompress or read after line" in report.skipped[0].reason
    read = report.documents - 7  # the lines before the damage are kept
    assert 0 < read < len(corpus)
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[:read] + corpus[:7], EOS)


def test_truncated_zstd_with_skip_bad_is_reported_and_skipped(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    zstandard = pytest.importorskip("zstandard")
    lines = "".join(json.dumps({"text": d}) + "\n" for d in corpus).encode()
    data = zstandard.ZstdCompressor().compress(lines)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.jsonl.zst").write_bytes(data[: len(data) // 2])
    write_jsonl(str(tmp_path / "src" / "u.jsonl"), corpus[:7])
    report = fastload.convert.text(
        str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=tokenizer_path, on_error="skip"
    )
    assert [s.item for s in report.skipped] == ["t.jsonl.zst"]
    assert "cannot decompress" in report.skipped[0].reason


def test_an_empty_document_is_left_out_and_counted(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    corpus = [d for d in corpus if d.strip()]
    write_jsonl(str(tmp_path / "a.jsonl"), [corpus[0], "", corpus[1], ""])
    report = fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tokenizer_path
    )
    assert report.documents == 2
    assert report.empty_documents == 2
    assert "2 empty document(s) left out" in report.summary()
    stream, starts = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[:2], EOS)
    assert len(starts) == 2


def test_a_non_utf8_line_names_file_and_line_or_is_skipped(
    tmp_path: Path, tokenizer_path: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "good one"}\n{"text": "caf\xe9"}\n{"text": "good two"}\n')
    with pytest.raises(SourceDataError, match=r"bad\.jsonl: line 2: .*utf-8"):
        fastload.convert.text(str(path), str(tmp_path / "out"), tokenizer=tokenizer_path)
    report = fastload.convert.text(
        str(path), str(tmp_path / "out"), tokenizer=tokenizer_path, on_error="skip"
    )
    assert [s.item for s in report.skipped] == ["bad.jsonl:2"]
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, ["good one", "good two"], EOS)


def test_seq_len_longer_than_the_corpus_is_a_clear_error(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:3])
    report = fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tokenizer_path
    )
    with pytest.raises(ConfigError, match=rf"seq_len.*{report.tokens} tokens"):
        fastload.TokenDataset(str(tmp_path / "out"), seq_len=report.tokens * 2, shuffle=False)


def test_help_lists_convert_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "convert text" in capsys.readouterr().out
