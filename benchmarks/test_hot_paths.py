"""pytest-benchmark suite for the hot paths: index build, shard read, cache hit, decode.

Run with ``make bench-hot`` (``pytest benchmarks/test_hot_paths.py --benchmark-only``);
CI's tests do not run it. Each group has its baseline in the same run (``tarfile``,
a plain file read, a plain ``open``+``read``, Pillow's full decode), so compare within
a group: ``--benchmark-group-by=group``.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastload.cache import DiskTier, EntryKey
from fastload.decode import decode_image
from fastload.shards.checksum import file_checksum
from fastload.shards.index import ShardIndex
from fastload.shards.reader import ShardReader
from fastload.shards.writer import ShardWriter

MEMBERS = 20_000


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hot") / "ds"
    rng = np.random.default_rng(0)
    with ShardWriter(str(root), shard_size="10GB") as w:
        for i in range(MEMBERS // 2):
            w.write({"__key__": f"{i:06d}", "jpg": rng.bytes(2048), "json": {"i": i}})
    return root / "shard-000000.tar"


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:480, 0:640]
    img = np.stack([(xx // 3) % 256, (yy // 2) % 256, (xx + yy) % 256], -1)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.benchmark(group="index")
def test_index_fastload(benchmark: Any, shard: Path) -> None:
    idx = benchmark(ShardIndex.build, str(shard))
    assert idx.num_members == MEMBERS


@pytest.mark.benchmark(group="index")
def test_index_tarfile_baseline(benchmark: Any, shard: Path) -> None:
    def scan() -> int:
        with tarfile.open(shard) as tf:
            return sum(1 for m in tf if m.isfile())

    assert benchmark(scan) == MEMBERS


@pytest.mark.benchmark(group="shard-read")
def test_read_every_sample_fastload(benchmark: Any, shard: Path) -> None:
    reader = ShardReader(shard)

    def read_all() -> int:
        total = 0
        for i in range(len(reader)):
            total += len(reader[i]["jpg"])
        return total

    assert benchmark(read_all) == 2048 * (MEMBERS // 2)


@pytest.mark.benchmark(group="shard-read")
def test_read_whole_file_baseline(benchmark: Any, shard: Path) -> None:
    assert benchmark(lambda: len(shard.read_bytes())) == os.path.getsize(shard)


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory, shard: Path) -> Iterator[tuple[DiskTier, Any]]:
    size, checksum = file_checksum(shard)
    key = EntryKey("file:///bench", shard.name, checksum)
    t = DiskTier(tmp_path_factory.mktemp("cache"))

    def fetch(f: Any) -> None:
        f.write(shard.read_bytes())

    t.get(key, size, fetch)
    yield t, (key, size, fetch)
    t.close()


@pytest.mark.benchmark(group="cache-hit")
def test_cache_hit_lookup(benchmark: Any, tier: tuple[DiskTier, Any]) -> None:
    t, (key, size, fetch) = tier
    path = benchmark(t.get, key, size, fetch)
    assert path.stat().st_size == size


@pytest.mark.benchmark(group="cache-hit")
def test_plain_open_baseline(benchmark: Any, shard: Path) -> None:
    def open_close() -> int:
        with open(shard, "rb") as f:
            return os.fstat(f.fileno()).st_size

    assert benchmark(open_close) > 0


@pytest.mark.benchmark(group="decode")
def test_decode_draft_224(benchmark: Any, jpeg: bytes) -> None:
    img = benchmark(decode_image, jpeg, size=(224, 224), resize="exact")
    assert img.size == (224, 224)


@pytest.mark.benchmark(group="decode")
def test_decode_full_then_resize_baseline(benchmark: Any, jpeg: bytes) -> None:
    def plain() -> Image.Image:
        return Image.open(io.BytesIO(jpeg)).convert("RGB").resize((224, 224), Image.BILINEAR)

    assert benchmark(plain).size == (224, 224)
