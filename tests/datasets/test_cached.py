"""fastload.cached: any map-style dataset, made once, then served from the cache."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

from fastload.datasets.cached import cached
from fastload.errors import ConfigError


class SlowDataset:
    """Counts how often each item is made, in a file per process (visible across forks)."""

    def __init__(self, n: int, log: Path) -> None:
        self.n = n
        self.log = log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        with open(self.log / f"made-{os.getpid()}", "a") as f:
            f.write(f"{i}\n")
        return {"index": i, "pixels": bytes([i % 256]) * (100 + i), "label": f"class {i % 3}"}


def made(log: Path) -> list[int]:
    return [int(x) for p in log.glob("made-*") for x in p.read_text().split()]


def test_first_touch_then_cache(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    inner = SlowDataset(50, tmp_path / "log")
    ds = cached(inner, cache_dir=tmp_path / "cache", shard_size="2KB")
    assert len(ds) == 50
    first = [ds[i] for i in range(50)]
    assert first == [inner[i] for i in range(50)]
    assert ds.stats()["misses"] == 50
    log_after_first = sorted(made(tmp_path / "log"))
    second = [ds[i] for i in range(50)]
    assert second == first
    assert ds.stats()["hits"] == 50
    assert sorted(made(tmp_path / "log")) == log_after_first  # nothing made twice
    assert len(list(ds.root.glob("items-*.tar"))) > 3  # rolled over at the shard size
    assert ds[-1] == inner[49]
    with pytest.raises(IndexError):
        ds[50]
    ds.close()
    # a new job on the same cache directory makes nothing
    again = cached(
        SlowDataset(50, tmp_path / "log"), cache_dir=tmp_path / "cache", shard_size="2KB"
    )
    assert [again[i] for i in range(50)] == first
    assert again.stats()["misses"] == 0
    again.close()


def test_lost_bytes_are_detected_and_the_item_remade(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    ds = cached(SlowDataset(5, tmp_path / "log"), cache_dir=tmp_path / "cache")
    [ds[i] for i in range(5)]
    ds.close()
    shard = next(ds.root.glob("items-*.tar"))
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # inside item 0's pickle (after its 512-byte header)
    shard.write_bytes(bytes(data))
    ds2 = cached(SlowDataset(5, tmp_path / "log"), cache_dir=tmp_path / "cache")
    assert ds2[0] == SlowDataset(5, tmp_path / "log")[0]
    assert ds2.stats()["remade"] == 1
    ds2.close()


def test_dataloader_workers_share_the_cache(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    inner = SlowDataset(64, tmp_path / "log")
    ds = cached(inner, cache_dir=tmp_path / "cache", transform=lambda item: item["index"])
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork")
    )
    assert [int(x) for b in loader for x in b] == list(range(64))
    assert sorted(made(tmp_path / "log")) == list(range(64))
    assert [int(x) for b in loader for x in b] == list(range(64))
    assert sorted(made(tmp_path / "log")) == list(range(64))  # epoch 2 made nothing


def test_needs_len(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="len"):
        cached(iter([1, 2]), cache_dir=tmp_path)


def test_loader_stats_count_worker_misses_after_the_parent_used_it(tmp_path: Path) -> None:
    import fastload

    (tmp_path / "log").mkdir()
    ds = cached(
        SlowDataset(40, tmp_path / "log"), cache_dir=tmp_path / "cache", transform=lambda x: 0
    )
    ds[0]  # the parent touches it first: its counters must not leak into the workers'
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2)
    assert sum(len(b) for b in loader) == 40
    io = loader.stats().io
    assert io["cache_misses"] == 39
    assert io["cache_hits"] == 1
