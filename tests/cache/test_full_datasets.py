"""The full-cache degrade is the same for every dataset type: with another reader's pins
filling the cap, ShardedDataset, StreamingDataset and TokenDataset read every sample
right through uncached reads, counted in ``io_stats()`` and ``loader.stats()``."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.cache import CachedShard, DiskTier, ShardCache
from fastload.config import CacheConfig
from fastload.datasets.sharded import ShardedDataset
from fastload.datasets.streaming import StreamingDataset
from fastload.shards.writer import ShardWriter
from fastload.text.synthetic import train_tokenizer

from .conftest import CountingFetch, blob, key_for

pytestmark = pytest.mark.filterwarnings("ignore:fastload read:RuntimeWarning")


class Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def _samples(n: int) -> list[dict[str, Any]]:
    return [{"__key__": f"s{i:05d}", "bin": blob(1000 + i, 700 + i % 97)} for i in range(n)]


def _pinned_full(root: Path) -> tuple[ShardCache, CachedShard]:
    """A cache at ``root`` whose cap is filled by an entry this (other) reader pins
    (open while the returned shard is)."""
    pinner = ShardCache(root)
    data = blob(7, 64 * 1024)
    held = pinner.open_shard("other", Info("pinned.tar", data), CountingFetch(data))
    assert pinner.disk is not None
    assert held.path is not None
    pinner.disk.set_limit(int(pinner.disk.usage()["total"] or 0) + 2048)
    return pinner, held


def test_sharded_and_streaming_datasets_read_uncached_when_the_cache_is_full(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url, shard_size="16KB") as w:
        for s in _samples(80):
            w.write(s)
    want = {s["__key__"]: s["bin"] for s in _samples(80)}
    root = tmp_path / "cache"
    pinner, held = _pinned_full(root)
    config = CacheConfig(cache_dir=str(root), room_wait_s=0.05)
    sharded = ShardedDataset(url, cache_config=config)
    got = {sharded[i]["__key__"]: sharded[i]["bin"] for i in range(len(sharded))}
    assert got == want
    assert sharded.io_stats()["uncached_reads"] > 0
    sharded.close()
    fresh = ShardedDataset(url, cache_config=config)
    loader = fastload.DataLoader(fresh, batch_size=8, collate_fn=lambda b: b)
    seen = [s for batch in loader for s in batch]
    assert {s["__key__"]: bytes(s["bin"]) for s in seen} == want
    assert loader.stats().io["uncached_reads"] > 0
    fresh.close()
    streaming = StreamingDataset(url, cache_config=config, shuffle=False)
    got = {s["__key__"]: bytes(s["bin"]) for s in streaming}
    assert got == want
    assert streaming.io_stats()["uncached_reads"] > 0
    streaming.close()
    assert pinner.disk is not None
    usage = pinner.disk.usage()
    assert usage["total"] <= usage["cap"]  # type: ignore[operator]
    assert bytes(held.data) == blob(7, 64 * 1024)  # the pinned entry stayed
    held.close()
    pinner.close()
    tier = DiskTier(root)
    assert tier.verify() == []
    assert tier.lifetime_counters()["uncached_reads"] > 0
    tier.close()


def test_a_token_dataset_reads_uncached_when_the_cache_is_full(tmp_path: Path) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    docs = [" ".join(words[(i * j) % 10] for j in range(5 + i % 40)) + "." for i in range(120)]
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(f'{{"text": "{d}"}}\n' for d in docs))
    tok = tmp_path / "tokenizer.json"
    train_tokenizer(docs, str(tok), vocab_size=300)
    out = str(tmp_path / "tokens")
    fastload.convert.text(str(src), out, tokenizer=str(tok), shard_size="1KB")
    plain = fastload.TokenDataset(out, seq_len=16, shuffle=False)
    want = [plain[k]["input_ids"].tolist() for k in range(plain.num_windows)]
    plain.close()
    root = tmp_path / "cache"
    pinner, held = _pinned_full(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ds = fastload.TokenDataset(
            out,
            seq_len=16,
            shuffle=False,
            cache_config=CacheConfig(cache_dir=str(root), room_wait_s=0.05),
        )
        got = [ds[k]["input_ids"].tolist() for k in range(ds.num_windows)]
    assert got == want
    assert ds.io_stats()["uncached_reads"] > 0
    ds.close()
    assert bytes(held.data) == blob(7, 64 * 1024)  # the pinned entry stayed
    held.close()
    pinner.close()
