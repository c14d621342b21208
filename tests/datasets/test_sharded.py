"""ShardedDataset: every sample exactly as written, through each tier, in workers too."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from ds_helpers import payload, write_dataset

from fastload.datasets.sharded import ShardedDataset
from fastload.errors import ConfigError, FastloadError, ShardFormatError


def _check(sample: dict[str, Any], i: int) -> None:
    assert sample == {"__key__": f"s{i:05d}", "bin": payload(i), "cls": str(i % 10).encode()}


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_every_sample_in_manifest_order(tmp_path: Path, tier: str) -> None:
    m = write_dataset(str(tmp_path / "ds"), n=150)
    assert len(m.shards) > 3
    cache_dir = tmp_path / "cache" if tier == "disk" else None
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=cache_dir)
    assert len(ds) == 150
    for i in range(len(ds)):
        _check(ds[i], i)
    _check(ds[-1], 149)
    with pytest.raises(IndexError):
        ds[150]
    stats = ds.io_stats()
    assert stats[f"{tier}_bytes"] > 0
    # each shard (and each index) was fetched once
    assert stats["remote_bytes"] == m.total_bytes + sum(s.index_bytes for s in m.shards)
    ds.close()


def test_disk_cache_is_reused_by_a_new_process_view(tmp_path: Path) -> None:
    m = write_dataset(str(tmp_path / "ds"), n=60)
    cache = tmp_path / "cache"
    first = ShardedDataset(str(tmp_path / "ds"), cache_dir=cache)
    for i in range(len(first)):
        first[i]
    assert first.io_stats()["remote_bytes"] >= m.total_bytes
    first.close()
    # a fresh dataset object (as a restarted job) finds everything on disk
    again = pickle.loads(pickle.dumps(ShardedDataset(str(tmp_path / "ds"), cache_dir=cache)))
    for i in range(len(again)):
        _check(again[i], i)
    assert again.io_stats()["remote_bytes"] == 0
    assert again.io_stats()["cache_misses"] == 0
    again.close()


def _collate(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(tmp_path: Path, context: str) -> None:
    write_dataset(str(tmp_path / "ds"), n=80)
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=tmp_path / "cache")
    ds[0]  # the parent has opened things: the workers must not reuse them
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=2, collate_fn=_collate, multiprocessing_context=context
    )
    got = [s for batch in loader for s in batch]
    assert len(got) == 80
    for i, s in enumerate(got):
        _check(s, i)
    ds.close()


def test_decode_option_and_transform(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=5)
    ds = ShardedDataset(str(tmp_path / "ds"), transform=lambda s: s["__key__"])
    assert [ds[i] for i in range(5)] == [f"s{i:05d}" for i in range(5)]
    with pytest.raises(ConfigError, match="size= needs decode="):
        ShardedDataset(str(tmp_path / "ds"), size=224)


def test_missing_dataset_and_bad_manifest(tmp_path: Path) -> None:
    with pytest.raises(FastloadError, match="manifest.json"):
        ShardedDataset(str(tmp_path / "nothing"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text('{"format": "x"}')
    with pytest.raises(ShardFormatError, match="not a fastload manifest"):
        ShardedDataset(str(tmp_path / "bad"))


def test_corrupted_remote_shard_is_an_error_not_a_wrong_sample(tmp_path: Path) -> None:
    m = write_dataset(str(tmp_path / "ds"), n=40)
    shard = tmp_path / "ds" / m.shards[1].name
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=tmp_path / "cache")
    _check(ds[0], 0)
    first_of_1 = int(m.sample_starts[1])
    with pytest.raises(FastloadError, match=m.shards[1].name):
        ds[first_of_1]
    ds.close()


@pytest.mark.s3
def test_over_seaweedfs_fetches_about_once(seaweed: Any, fault_proxy: Any, tmp_path: Path) -> None:
    url = seaweed.new_url("ds")
    m = write_dataset(url, n=200, shard_size="32KB", storage_options=seaweed.storage_options)
    opts = fault_proxy.storage_options
    before = fault_proxy.stats.body_bytes_to_client
    ds = ShardedDataset(url, cache_dir=tmp_path / "cache", storage_options=opts)
    for i in range(len(ds)):
        _check(ds[i], i)
    epoch1 = fault_proxy.stats.body_bytes_to_client - before
    payload_bytes = m.total_bytes + sum(s.index_bytes for s in m.shards)
    # the manifest plus every shard and index once
    assert payload_bytes <= epoch1 <= payload_bytes * 1.05 + 20_000
    ds.close()
    # epoch 2 with 2 DataLoader workers, from a fresh dataset object: nothing refetched
    ds2 = ShardedDataset(url, cache_dir=tmp_path / "cache", storage_options=opts)
    mid = fault_proxy.stats.body_bytes_to_client
    loader = torch.utils.data.DataLoader(ds2, batch_size=16, num_workers=2, collate_fn=_collate)
    got = [s for b in loader for s in b]
    assert len(got) == 200
    for i, s in enumerate(got):
        _check(s, i)
    assert fault_proxy.stats.body_bytes_to_client - mid == 0
    ds2.close()


def test_cache_config_reaches_the_cache(tmp_path: Path) -> None:
    from fastload.config import CacheConfig

    write_dataset(str(tmp_path / "ds"), n=10)
    ds = ShardedDataset(
        str(tmp_path / "ds"),
        cache_dir=tmp_path / "cache",
        cache_limit="1MB",
        cache_config=CacheConfig(wait_deadline_s=7.5, verify="open"),
    )
    _check(ds[3], 3)
    disk = ds.source.cache.disk
    assert disk is not None
    assert disk.wait_deadline_s == 7.5
    assert disk.limit == 10**6
    assert disk.verify_policy == "open"
    ds.close()
