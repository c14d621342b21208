"""``ParquetDataset``: rows by row group through the node cache, and token windows
tokenized once per node."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from text_helpers import (
    converted_stream,
    make_corpus,
    reference_windows,
    train_tokenizer,
    write_parquet,
)

import fastload
from fastload import World
from fastload.errors import ConfigError, ShardFormatError
from fastload.storage import open_store
from fastload.text import ParquetDataset, ParquetTokenDataset

EOS = 2


def parquet_dir(root: Path, corpus: list[str], files: int = 3) -> Path:
    step = -(-len(corpus) // files)
    for k in range(files):
        write_parquet(str(root / f"part-{k:03d}.parquet"), corpus[k * step : (k + 1) * step])
    return root


def test_rows_in_file_and_row_order(tmp_path: Path, corpus: list[str]) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    ds = ParquetDataset(str(root))
    assert len(ds) == len(corpus)
    assert [ds[i]["text"] for i in range(len(ds))] == corpus
    assert ds[0].keys() == {"text", "id"}
    assert ds[-1]["text"] == corpus[-1]
    only = ParquetDataset(str(root / "*.parquet"), columns=["text"])
    assert only[5] == {"text": corpus[5]}
    with pytest.raises(IndexError):
        ds[len(corpus)]


def test_not_parquet_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(ShardFormatError, match=r"x\.parquet"):
        ParquetDataset(str(tmp_path / "x.parquet"))


def test_tokens_need_seq_len_and_cache_dir(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    with pytest.raises(TypeError, match="seq_len"):
        ParquetTokenDataset(
            str(root), tokenizer=tokenizer_path, cache_dir=tmp_path / "c", shuffle=False
        )  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="cache_dir"):
        ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=8, shuffle=False)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="cache_dir"):
        ParquetTokenDataset(
            str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=None, shuffle=False
        )  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_a_cache_dir_removed_and_made_again_in_one_process(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    """``rm -rf cache_dir`` between two datasets of one process (a notebook, a sweep):
    the second builds its tokens into the new directory and accounts them there (the
    process's tier over the old directory had its catalog unlinked and its lock
    directory gone: FileNotFoundError on ``locks/~tokens-...lock`` before)."""
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    windows = []
    for _ in range(2):
        ds = ParquetTokenDataset(
            str(root), tokenizer=tokenizer_path, seq_len=16, cache_dir=cache, shuffle=False
        )
        windows.append([w["input_ids"].tolist() for w in ds])
        ds.close()
        del ds
        # the tokens are accounted in this directory's own catalog
        assert (cache / "catalog.sqlite").is_file()
        assert (cache / "locks").is_dir()
        shutil.rmtree(cache)
    assert windows[0] == windows[1]
    assert windows[0]


def _parquet_on_s3(
    seaweed: Any, tmp_path: Path, corpus: list[str], files: int
) -> tuple[Path, str, dict[str, Any]]:
    """``corpus`` as ``files`` Parquet files, written locally and uploaded to a fresh
    bucket: the local folder, the URL and the storage options."""
    root = parquet_dir(tmp_path / "pq", corpus, files=files)
    url, opts = seaweed.new_url("pq"), seaweed.storage_options
    store = open_store(url, opts)
    for p in sorted(root.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    return root, url, opts


def test_rows_from_s3_fetched_once_per_node(seaweed: Any, tmp_path: Path) -> None:
    corpus = make_corpus(200, seed=3)
    root, url, opts = _parquet_on_s3(seaweed, tmp_path, corpus, files=4)
    sizes = sum(p.stat().st_size for p in root.iterdir())
    cache = tmp_path / "cache"
    ds = ParquetDataset(url, cache_dir=cache, storage_options=opts)
    assert [ds[i]["text"] for i in range(len(ds))] == corpus
    assert ds.io_stats()["remote_bytes"] == sizes  # each file once, whole
    ds.close()
    again = ParquetDataset(url, cache_dir=cache, storage_options=opts)
    assert [again[i]["id"] for i in range(0, len(again), 7)] == [
        r["id"] for k in range(4) for r in pq.read_table(root / f"part-{k:03d}.parquet").to_pylist()
    ][::7]
    assert again.io_stats()["remote_bytes"] == 0  # served by the node's disk tier
    again.close()


def _ids(batch: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in batch]


def test_rows_through_the_loader_with_workers(seaweed: Any, tmp_path: Path) -> None:
    corpus = make_corpus(120, seed=4)
    root, url, opts = _parquet_on_s3(seaweed, tmp_path, corpus, files=3)
    ds = ParquetDataset(url, columns=["id"], cache_dir=tmp_path / "cache", storage_options=opts)
    loader = fastload.DataLoader(
        ds, batch_size=8, shuffle=True, seed=1, num_workers=2, world=World.single(),
        collate_fn=_ids,
    )  # fmt: skip
    ids = [i for batch in loader for i in batch]
    want = [
        r["id"] for k in range(3) for r in pq.read_table(root / f"part-{k:03d}.parquet").to_pylist()
    ]
    assert sorted(ids) == sorted(want)
    assert ids != sorted(ids)


def test_token_windows_tokenized_once(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    root = parquet_dir(tmp_path / "pq", corpus)
    cache = tmp_path / "cache"
    ds = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=32, cache_dir=cache,
                        world=World.single(), shuffle=False)  # fmt: skip
    assert isinstance(ds, ParquetTokenDataset)
    assert isinstance(ds, fastload.TokenDataset)
    assert ds.tokenized_here
    ref = reference_windows(converted_stream(tokenizer_path, corpus, EOS), 32)
    assert [tuple(x["input_ids"].tolist()) for x in ds] == [tuple(w[0]) for w in ref]
    again = ParquetTokenDataset(str(root), tokenizer=tokenizer_path, seq_len=32, cache_dir=cache,
                           world=World.single(), shuffle=False)  # fmt: skip
    assert not again.tokenized_here
    assert again.token_dir == ds.token_dir
    assert again[len(ref) - 1]["labels"].tolist() == ref[-1][1]
    # another tokenizer is another key: tokenized afresh
    other = train_tokenizer(corpus, str(tmp_path / "other.json"), vocab_size=280)
    third = ParquetTokenDataset(
        str(root), tokenizer=other, seq_len=32, cache_dir=cache, shuffle=False
    )
    assert third.tokenized_here
    assert third.token_dir != ds.token_dir


def test_tokens_from_s3_epoch_two_reads_nothing_remote(
    seaweed: Any, tmp_path: Path, tokenizer_path: str
) -> None:
    corpus = make_corpus(150, seed=5)
    root, url, opts = _parquet_on_s3(seaweed, tmp_path, corpus, files=3)
    sizes = sum(p.stat().st_size for p in root.iterdir())
    cache = tmp_path / "cache"
    ds = ParquetTokenDataset(url, tokenizer=tokenizer_path, seq_len=16, cache_dir=cache,
                        storage_options=opts, shuffle=True, world=World.single())  # fmt: skip
    after_first = ds.source_remote_bytes()
    assert after_first >= sizes  # footers + the files, read once to tokenize
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2, world=World.single())
    for _epoch in range(2):
        n = sum(1 for _ in loader)
        assert n == len(loader)
    assert ds.source_remote_bytes() == after_first  # epochs read tokens, not parquet
    later = ParquetTokenDataset(url, tokenizer=tokenizer_path, seq_len=16, cache_dir=cache,
                           storage_options=opts, shuffle=False)  # fmt: skip
    assert not later.tokenized_here
    assert later.source_remote_bytes() < sizes / 4  # footers only


def test_both_modes_pickle_for_spawned_workers(
    tmp_path: Path, corpus: list[str], tokenizer_path: str
) -> None:
    import pickle

    root = parquet_dir(tmp_path / "pq", corpus)
    rows = ParquetDataset(str(root), columns=["text"])
    rows[3]
    copy = pickle.loads(pickle.dumps(rows))
    assert [copy[i] for i in (0, 3, len(corpus) - 1)] == [rows[i] for i in (0, 3, len(corpus) - 1)]
    toks = ParquetTokenDataset(
        str(root), tokenizer=tokenizer_path, seq_len=8, cache_dir=tmp_path / "c", shuffle=False
    )
    toks[0]
    again = pickle.loads(pickle.dumps(toks))
    assert again[5]["input_ids"].tolist() == toks[5]["input_ids"].tolist()
