"""A ``CacheConfig`` passed as ``cache_config`` and the explicit cache arguments combine
by one rule (``CacheConfig.with_arguments``): nothing passed is dropped, and a value
set in both places must agree or the dataset refuses to start, before any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest
from ds_helpers import write_dataset

from fastload.config import CacheConfig
from fastload.datasets.sharded import ShardedDataset
from fastload.errors import ConfigError


def _read_all(ds: ShardedDataset) -> None:
    for i in range(len(ds)):
        ds[i]


def test_the_configs_cache_dir_gets_the_shards(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=40)
    cache = tmp_path / "nvme"
    ds = ShardedDataset(str(tmp_path / "ds"), cache_config=CacheConfig(cache_dir=str(cache)))
    assert ds.source.cache_dir == str(cache)
    _read_all(ds)
    assert ds.io_stats()["disk_bytes"] > 0
    assert any(p.suffix == ".tar" or "tar" in p.name for p in cache.rglob("*") if p.is_file())
    ds.close()


def test_the_configs_limits_are_kept_beside_an_explicit_cache_dir(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), n=10)
    config = CacheConfig(cache_limit="64MB", ram_limit="1GB", room_wait_s=3.0)
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=tmp_path / "c", cache_config=config)
    got = ds.source.cache_config
    assert (got.cache_limit, got.ram_limit, got.room_wait_s) == (64 * 10**6, 10**9, 3.0)
    assert got.cache_dir == str(tmp_path / "c")
    ds.close()


def test_the_environment_does_not_override_the_configs_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dataset(str(tmp_path / "ds"), n=10)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "from-env"))
    ds = ShardedDataset(
        str(tmp_path / "ds"), cache_config=CacheConfig(cache_dir=str(tmp_path / "x"))
    )
    assert ds.source.cache_dir == str(tmp_path / "x")
    ds.close()
    plain = ShardedDataset(str(tmp_path / "ds"))
    assert plain.source.cache_dir == str(tmp_path / "from-env")
    plain.close()


@pytest.mark.parametrize(
    ("argument", "config"),
    [
        ({"cache_dir": "/a"}, CacheConfig(cache_dir="/b")),
        ({"cache_limit": "1GB"}, CacheConfig(cache_limit="2GB")),
        ({"ram_limit": "1GB"}, CacheConfig(ram_limit="3GB")),
    ],
)
def test_a_value_set_twice_differently_is_refused_before_any_io(
    tmp_path: Path, argument: dict[str, str], config: CacheConfig
) -> None:
    missing = str(tmp_path / "no-such-dataset")  # any read would fail differently
    name = next(iter(argument))
    with pytest.raises(ConfigError, match=rf"{name}=.*conflicts with cache_config\.{name}"):
        ShardedDataset(missing, cache_config=config, **argument)  # type: ignore[arg-type]


def test_with_arguments_rule() -> None:
    base = CacheConfig()
    assert base.with_arguments(cache_dir=None, cache_limit=None) is base
    assert base.with_arguments(cache_limit="1KB").cache_limit == 1000
    set_ = CacheConfig(cache_limit="1KB", prefetch_shards=5)
    assert set_.with_arguments(cache_limit=1000).cache_limit == 1000  # the same value agrees
    assert set_.with_arguments(prefetch_shards=5).prefetch_shards == 5
    with pytest.raises(ConfigError, match="prefetch_shards=3 conflicts"):
        set_.with_arguments(prefetch_shards=3)
    with pytest.raises(TypeError, match="no field 'cache_size'"):
        base.with_arguments(cache_size=1)
    assert CacheConfig().prefetch_shards == 2  # the datasets' default, one place


def test_the_streaming_dataset_takes_the_configs_ram_limit(tmp_path: Path) -> None:
    # its ram_limit defaulted to 2 GB explicitly, which refused any other configured value
    from fastload.datasets.streaming import StreamingDataset

    write_dataset(str(tmp_path / "ds"), n=10)
    ds = StreamingDataset(str(tmp_path / "ds"), cache_config=CacheConfig(ram_limit="1GB"))
    assert ds.source.cache_config.ram_limit == 10**9
    assert StreamingDataset(str(tmp_path / "ds")).source.cache_config.ram_limit == 2 * 10**9
