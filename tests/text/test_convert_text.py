"""``fastload.convert.text`` and ``fastload convert text``: token ids, boundaries,
dtype, EOS, bad input and atomic publish, from local files and from SeaweedFS."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from text_helpers import (
    converted_stream,
    doc_starts,
    make_corpus,
    train_tokenizer,
    write_jsonl,
    write_parquet,
)

import fastload
from fastload.cli import main
from fastload.convert import SourceDataError
from fastload.errors import ConfigError, OutputExistsError
from fastload.text.sources import list_sources
from fastload.text.tokenizer import token_dtype
from fastload.text.tokens import TokenSource

EOS = 2  # "</s>" in the test tokenizer


def read_stream(url: str, storage_options: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The whole token stream and the global document starts of a token dataset."""
    src = TokenSource(url, storage_options=storage_options)
    tokens, starts, base = [], [], 0
    for s, n in enumerate(src.shard_tokens):
        out = np.empty(n, dtype=np.int64)
        src.tokens(s, 0, n, out)
        tokens.append(out)
        docs = np.array(src.docs(s))
        assert docs[0] == 0
        assert docs[-1] == n
        starts.append(docs[:-1] + base)
        base += n
    src.close()
    return np.concatenate(tokens), np.concatenate(starts)


def mixed_sources(root: Path, corpus: list[str]) -> Path:
    write_jsonl(str(root / "a.jsonl"), corpus[:80])
    write_jsonl(str(root / "b.jsonl.gz"), corpus[80:160])
    write_jsonl(str(root / "c.jsonl.zst"), corpus[160:230])
    write_parquet(str(root / "d.parquet"), corpus[230:])
    return root


def test_ids_are_encode_batch_plus_eos_over_every_format(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    src = mixed_sources(tmp_path / "src", corpus)
    report = fastload.convert.text(
        str(src), str(tmp_path / "out"), tokenizer=tokenizer_path, shard_size="4KB"
    )
    stream, starts = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus, EOS)
    assert starts.tolist() == doc_starts(tokenizer_path, corpus, EOS).tolist()
    m = report.manifest
    assert m.kind == "tokens"
    assert m.source["dtype"] == "uint16"
    assert m.source["eos_id"] == EOS
    assert report.documents + report.empty_documents == len(corpus)
    assert report.empty_documents == sum(1 for d in corpus if not d.strip())
    assert report.tokens == stream.size
    assert len(m.shards) > 5  # small shards force many, so boundaries are exercised
    assert sum(m.source["shard_tokens"]) == stream.size


def test_uint32_and_explicit_eos(tmp_path: Path, corpus: list[str], tokenizer_path: str) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:50])
    fastload.convert.text(
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "out"),
        tokenizer=tokenizer_path,
        dtype="uint32",
        eos_id=1,
    )
    m = fastload.Manifest.load(str(tmp_path / "out"))
    assert m.source["dtype"] == "uint32"
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[:50], 1)


def test_dtype_choice() -> None:
    assert token_dtype("auto", 65536) == np.dtype("<u2")
    assert token_dtype("auto", 65537) == np.dtype("<u4")
    with pytest.raises(ConfigError, match="does not fit in uint16"):
        token_dtype("uint16", 100_000)
    with pytest.raises(ConfigError, match="dtype must be"):
        token_dtype("int8", 10)


def test_no_eos_token_is_a_clear_error(tmp_path: Path, corpus: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=100, special_tokens=["<unk>"], show_progress=False)
    )
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:5])
    with pytest.raises(ConfigError, match="no EOS token.*--eos-id"):
        fastload.convert.text(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tok)
    with pytest.raises(ConfigError, match="outside the tokenizer's vocabulary"):
        fastload.convert.text(
            str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tok, eos_id=10**6
        )
    assert not (tmp_path / "out" / "manifest.json").exists()


def _bad_jsonl(path: Path) -> Path:
    lines = ['{"text": "good one"}', '{"text": "good two"', '{"other": 1}', '{"text": 5}',
             '{"text": "good three"}']  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_corrupt_line_names_file_and_line(tmp_path: Path, tokenizer_path: str) -> None:
    bad = _bad_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(SourceDataError, match=r"bad\.jsonl: line 2: not valid JSON"):
        fastload.convert.text(str(bad), str(tmp_path / "out"), tokenizer=tokenizer_path)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").glob("shard-*.tar"))  # nothing half-published


def test_missing_field_names_file_and_line(tmp_path: Path, tokenizer_path: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"text": "x"}\n{"body": "y"}\n')
    with pytest.raises(SourceDataError, match=r"m\.jsonl: line 2: no field 'text'"):
        fastload.convert.text(str(path), str(tmp_path / "out"), tokenizer=tokenizer_path)


def test_skip_bad_reports_each_line(tmp_path: Path, tokenizer_path: str) -> None:
    bad = _bad_jsonl(tmp_path / "bad.jsonl")
    report = fastload.convert.text(
        str(bad), str(tmp_path / "out"), tokenizer=tokenizer_path, on_error="skip"
    )
    assert [s.item for s in report.skipped] == ["bad.jsonl:2", "bad.jsonl:3", "bad.jsonl:4"]
    assert "not a string" in report.skipped[2].reason
    assert report.documents == 2
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, ["good one", "good three"], EOS)


def test_truncated_gzip_names_the_file(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    data = gzip.compress(("\n".join(json.dumps({"text": d}) for d in corpus)).encode())
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceDataError, match=r"t\.jsonl\.gz: cannot decompress"):
        fastload.convert.text(
            str(tmp_path / "t.jsonl.gz"), str(tmp_path / "out"), tokenizer=tokenizer_path
        )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_parquet_without_the_column(tmp_path: Path, tokenizer_path: str) -> None:
    write_parquet(str(tmp_path / "p.parquet"), ["a", "b"])
    with pytest.raises(SourceDataError, match=r"p\.parquet: no column 'body'"):
        fastload.convert.text(
            str(tmp_path / "p.parquet"),
            str(tmp_path / "out"),
            tokenizer=tokenizer_path,
            text_field="body",
        )


def test_existing_dataset_needs_overwrite(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:20])
    out = str(tmp_path / "out")
    fastload.convert.text(str(tmp_path / "a.jsonl"), out, tokenizer=tokenizer_path)
    with pytest.raises(OutputExistsError, match="already holds a dataset"):
        fastload.convert.text(str(tmp_path / "a.jsonl"), out, tokenizer=tokenizer_path)
    write_jsonl(str(tmp_path / "b.jsonl"), corpus[20:40])
    fastload.convert.text(str(tmp_path / "b.jsonl"), out, tokenizer=tokenizer_path, overwrite=True)
    stream, _ = read_stream(out)
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[20:40], EOS)


def test_a_failed_overwrite_leaves_the_old_dataset_whole(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:40])
    out = tmp_path / "out"
    fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(out), tokenizer=tokenizer_path, shard_size="1KB"
    )
    before = sorted(p.name for p in out.iterdir())
    old = converted_stream(tokenizer_path, corpus[:40], EOS)
    # many good documents (new shards get written), then a bad line: refused whole
    write_jsonl(str(tmp_path / "src" / "a.jsonl"), corpus)
    (tmp_path / "src" / "z.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(SourceDataError, match=r"z\.jsonl.*line 2"):
        fastload.convert.text(str(tmp_path / "src"), str(out), tokenizer=tokenizer_path,
                              shard_size="1KB", overwrite=True)  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == before  # the new shards were removed
    assert read_stream(str(out))[0].tolist() == old  # and the old dataset still reads
    # a good overwrite replaces it, and the old generation's shards are deleted
    fastload.convert.text(str(tmp_path / "src" / "a.jsonl"), str(out), tokenizer=tokenizer_path,
                          shard_size="1KB", overwrite=True)  # fmt: skip
    assert read_stream(str(out))[0].tolist() == converted_stream(tokenizer_path, corpus, EOS)
    names = {p.name for p in out.iterdir()}
    assert not (names & set(before)) - {"manifest.json"}


def test_failure_after_shards_leaves_no_manifest(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    # good files first (shards get written), then a bad one: still nothing published
    write_jsonl(str(tmp_path / "src" / "a.jsonl"), corpus)
    (tmp_path / "src" / "z.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(SourceDataError, match=r"z\.jsonl: line 2"):
        fastload.convert.text(str(tmp_path / "src"), str(tmp_path / "out"),
                              tokenizer=tokenizer_path, shard_size="1KB")  # fmt: skip
    assert not (tmp_path / "out" / "manifest.json").exists()
    with pytest.raises(fastload.StorageError):
        TokenSource(str(tmp_path / "out"))


def test_glob_and_list_in_name_order(tmp_path: Path, corpus: list[str]) -> None:
    for name in ("b.jsonl", "a.jsonl", "c.parquet", "notes.txt"):
        (tmp_path / name).write_text("")
    names = [s.name.rsplit("/", 1)[-1] for s in list_sources(str(tmp_path))]
    assert names == ["a.jsonl", "b.jsonl", "c.parquet"]
    names = [s.name.rsplit("/", 1)[-1] for s in list_sources(str(tmp_path / "*.jsonl"))]
    assert names == ["a.jsonl", "b.jsonl"]
    with pytest.raises(SourceDataError, match="no such file"):
        list_sources(str(tmp_path / "missing"))


def test_datasets_dataset_source(tmp_path: Path, corpus: list[str], tokenizer_path: str) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": corpus[:60]})
    fastload.convert.text(ds, str(tmp_path / "out"), tokenizer=tokenizer_path)
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[:60], EOS)


def test_cli_convert_text_json(
    tmp_path: Path, corpus: list[str], tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:30])
    bad = _bad_jsonl(tmp_path / "bad.jsonl")
    rc = main(["convert", "text", str(tmp_path / "a.jsonl"), str(bad), str(tmp_path / "out"),
               "--tokenizer", tokenizer_path, "--skip-bad", "--json", "--quiet"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "tokens"
    assert doc["documents"] + doc["empty_documents"] == 32
    assert len(doc["skipped"]) == 3
    rc = main(["convert", "text", str(bad), str(tmp_path / "out2"), "--tokenizer",
               tokenizer_path, "--quiet"])  # fmt: skip
    assert rc == 1
    assert "bad.jsonl: line 2" in capsys.readouterr().err


def test_sources_and_output_on_s3(seaweed, tmp_path: Path, tokenizer_path: str) -> None:
    corpus = make_corpus(120, seed=7)
    opts = seaweed.storage_options
    root = seaweed.new_url("raw")
    local = mixed_sources(tmp_path / "src", corpus)
    from fastload.storage import open_store

    store = open_store(root, opts)
    for p in sorted(local.iterdir()):
        store.write_bytes(f"part/{p.name}", p.read_bytes())
    out = seaweed.new_url("tokens")
    fastload.convert.text(root + "/part", out, tokenizer=tokenizer_path, storage_options=opts,
                          shard_size="2KB")  # fmt: skip
    stream, _ = read_stream(out, opts)
    assert stream.tolist() == converted_stream(tokenizer_path, corpus, EOS)
    # a glob over the prefix picks the compressed JSONL only
    out2 = seaweed.new_url("tokens2")
    fastload.convert.text(
        root + "/part/*.jsonl.*", out2, tokenizer=tokenizer_path, storage_options=opts
    )
    stream2, _ = read_stream(out2, opts)
    assert stream2.tolist() == converted_stream(tokenizer_path, corpus[80:230], EOS)


def test_tokenizer_path_and_object_agree(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    tok = train_tokenizer(corpus, str(tmp_path / "again.json"))
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:10])
    r1 = fastload.convert.text(str(tmp_path / "a.jsonl"), str(tmp_path / "o1"), tokenizer=tok)
    r2 = fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(tmp_path / "o2"), tokenizer=tmp_path / "again.json"
    )
    assert r1.manifest.source["tokenizer"] == r2.manifest.source["tokenizer"]


def test_truncated_or_corrupt_zstd_names_the_file(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    import zstandard

    data = zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": d}) + "\n" for d in corpus).encode()
    )
    (tmp_path / "t.jsonl.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceDataError, match=r"t\.jsonl\.zst: cannot decompress.*truncated"):
        fastload.convert.text(
            str(tmp_path / "t.jsonl.zst"), str(tmp_path / "out"), tokenizer=tokenizer_path
        )
    (tmp_path / "g.jsonl.zst").write_bytes(b"not zstd at all" * 10)
    with pytest.raises(SourceDataError, match=r"g\.jsonl\.zst: cannot decompress"):
        fastload.convert.text(
            str(tmp_path / "g.jsonl.zst"), str(tmp_path / "out"), tokenizer=tokenizer_path
        )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_multi_frame_zstd(tmp_path: Path, corpus: list[str], tokenizer_path: str) -> None:
    import zstandard

    c = zstandard.ZstdCompressor()
    frames = [
        c.compress("".join(json.dumps({"text": d}) + "\n" for d in part).encode())
        for part in (corpus[:40], corpus[40:41], corpus[41:90])
    ]
    (tmp_path / "m.jsonl.zst").write_bytes(b"".join(frames))
    fastload.convert.text(
        str(tmp_path / "m.jsonl.zst"), str(tmp_path / "out"), tokenizer=tokenizer_path
    )
    stream, _ = read_stream(str(tmp_path / "out"))
    assert stream.tolist() == converted_stream(tokenizer_path, corpus[:90], EOS)


def test_inspect_shows_token_facts(
    tmp_path: Path, corpus: list[str], tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(str(tmp_path / "a.jsonl"), corpus[:20])
    report = fastload.convert.text(
        str(tmp_path / "a.jsonl"), str(tmp_path / "out"), tokenizer=tokenizer_path
    )
    assert main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shard_kind"] == "tokens"
    assert doc["tokens"]["tokens"] == report.tokens
    assert doc["tokens"]["documents"] == report.documents == 20 - report.empty_documents
    assert doc["tokens"]["dtype"] == "uint16"
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert (
        f"tokens   {report.tokens} uint16 tokens of {report.documents} documents"
        in capsys.readouterr().out
    )
