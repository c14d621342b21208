"""``fastload.convert.text`` through the tokenizing pool
(:mod:`fastload.text.tokenize_pool`): the shards are byte for byte those of the
one-batch-at-a-time loop (:func:`fastload.text.writer.encode_documents`) it
replaced, over local files and over SeaweedFS, with the progress bar kept."""

from __future__ import annotations

from pathlib import Path

import tokenizers
from text_helpers import make_corpus, write_jsonl, write_parquet

import fastload
from fastload.shards.report import ErrorPolicy
from fastload.shards.writer import ShardWriter
from fastload.storage import open_store
from fastload.text.sources import list_sources, read_documents
from fastload.text.tokenizer import token_dtype
from fastload.text.writer import TokenShardWriter, encode_documents

EOS = 2


def one_batch_loop(src: str, out: Path, tokenizer_path: str, opts: dict | None = None) -> None:
    """The shards the converter wrote before the pool: read, encode one batch at a
    time in this thread, cut into shards."""
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    dtype = token_dtype("auto", tok.get_vocab_size(with_added_tokens=True))
    writer = ShardWriter(str(out), "3KB", None, {"kind": "tokens"})
    shards = TokenShardWriter(writer, dtype)
    docs = read_documents(list_sources(src, opts), "text", ErrorPolicy("raise"), opts)
    for tokens, lengths in encode_documents(tok, docs, EOS, dtype, {}):
        shards.add(tokens, lengths)
    shards.close()
    writer.close()


def shard_bytes(url: str, opts: dict | None = None) -> dict[str, bytes]:
    store = open_store(url, opts)
    names = [n for n in store.list("") if n.endswith(".tar")]
    return {n: store.read(n) for n in sorted(names)}


def corpus_files(root: Path) -> list[str]:
    """Several batches of 1,024 documents (empty ones among them) over JSONL and
    parquet, so that batches are encoded out of order by the pool."""
    docs = make_corpus(3000, seed=11)
    docs[5] = docs[1500] = ""
    root.mkdir(parents=True)
    write_jsonl(str(root / "a.jsonl"), docs[:1200])
    write_parquet(str(root / "b.parquet"), docs[1200:2500], row_group_size=300)
    write_jsonl(str(root / "c.jsonl.gz"), docs[2500:])
    return docs


def test_convert_text_shards_are_those_of_the_one_batch_loop(
    tmp_path: Path, tokenizer_path: str, capsys
) -> None:
    docs = corpus_files(tmp_path / "src")
    one_batch_loop(str(tmp_path / "src"), tmp_path / "ref", tokenizer_path)
    report = fastload.convert.text(str(tmp_path / "src"), str(tmp_path / "out"),
                                   tokenizer=tokenizer_path, shard_size="3KB",
                                   progress=True)  # fmt: skip
    ref, got = shard_bytes(str(tmp_path / "ref")), shard_bytes(str(tmp_path / "out"))
    assert len(ref) > 20  # many shards: boundaries inside and across batches
    assert got == ref
    assert report.documents + report.empty_documents == len(docs)
    assert report.empty_documents == sum(1 for d in docs if not d.strip())
    assert "tokenizing" in capsys.readouterr().err  # the progress bar, as before


def test_convert_text_on_seaweedfs_matches_the_one_batch_loop(
    seaweed, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus_files(tmp_path / "src")
    opts = seaweed.storage_options
    root = seaweed.new_url("pool-src")
    store = open_store(root, opts)
    for p in sorted((tmp_path / "src").iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    one_batch_loop(root, tmp_path / "ref", tokenizer_path, opts)
    out = seaweed.new_url("pool-out")
    fastload.convert.text(root, out, tokenizer=tokenizer_path, shard_size="3KB",
                          storage_options=opts)  # fmt: skip
    assert shard_bytes(out, opts) == shard_bytes(str(tmp_path / "ref"))
