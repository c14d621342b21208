"""ShardIndex: construction from paths and buffers, accessors, save/load, DALI output."""

from __future__ import annotations

import mmap
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastload import ShardFormatError, ShardIndex, _native

from . import tars


@pytest.fixture
def shard(tmp_path: Path, small_tar: bytes) -> Path:
    path = tmp_path / "shard-000000.tar"
    path.write_bytes(small_tar)
    return path


def test_build_sources_agree(shard: Path, small_tar: bytes) -> None:
    expected = ShardIndex.build(shard).to_bytes()
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        from_mmap = ShardIndex.build(mm).to_bytes()
    sources: list[Any] = [
        str(shard),
        small_tar,
        bytearray(small_tar),
        memoryview(small_tar),
        np.frombuffer(small_tar, dtype=np.uint8),
    ]
    for source in sources:
        assert ShardIndex.build(source).to_bytes() == expected
    assert from_mmap == expected


def test_accessors(shard: Path, small_tar: bytes) -> None:
    index = ShardIndex.build(shard)
    assert len(index) == index.num_samples == 3
    assert index.num_members == 6
    assert index.shard_size == len(small_tar)
    assert index.offsets.dtype == np.uint64
    assert index.sizes.dtype == np.uint64
    assert not index.offsets.flags.writeable
    assert index.names == [
        "k0.jpg",
        "k0.json",
        "dir/k1.jpg",
        "dir/k1.json",
        "k2.seg.png",
        "k2.cls",
    ]
    assert [index.key(i) for i in range(3)] == ["k0", "dir/k1", "k2"]
    assert index.key(-1) == "k2"
    assert index.fields(2) == ["seg.png", "cls"]
    assert list(index.members(1)) == [2, 3]
    with tarfile.open(shard) as tar:
        for i in range(3):
            sample = index.sample(i)
            key = sample.pop("__key__")
            for field, (off, size) in sample.items():
                member = tar.getmember(f"{key}.{field}")
                assert (off, size) == (member.offset_data, member.size)
                assert small_tar[off : off + size] == tar.extractfile(member).read()  # type: ignore[union-attr]
    start, end = index.sample_range(0)
    assert start == index.sample(0)["jpg"][0]
    assert end == index.sample(0)["json"][0] + index.sample(0)["json"][1]
    assert index.sample_range(1) == (index.sample(1)["jpg"][0], index.sample(1)["json"][0] + 2)
    assert "samples=3" in repr(index)
    assert str(shard) in repr(index)


@pytest.mark.parametrize("i", [3, -4, 100])
def test_out_of_range(shard: Path, i: int) -> None:
    index = ShardIndex.build(shard)
    for fn in (index.sample, index.key, index.fields, index.sample_range):
        with pytest.raises(IndexError, match="out of range"):
            fn(i)


def test_save_load_round_trip_uses_mmap(shard: Path, tmp_path: Path) -> None:
    index = ShardIndex.build(shard)
    idx_path = tmp_path / "shard-000000.tar.idx"
    index.save(idx_path)
    assert sorted(os.listdir(tmp_path)) == ["shard-000000.tar", "shard-000000.tar.idx"]
    loaded = ShardIndex.load(idx_path)
    assert isinstance(loaded._buffer, mmap.mmap)
    # the arrays are views of the map, not copies
    assert isinstance(loaded.offsets.base, memoryview)
    assert loaded.offsets.base.obj is loaded._buffer
    assert loaded.to_bytes() == index.to_bytes() == idx_path.read_bytes()
    assert [loaded.sample(i) for i in range(3)] == [index.sample(i) for i in range(3)]
    assert loaded.name == str(idx_path)
    # saving over an existing file replaces it
    ShardIndex.build(tars.samples_tar([("z", [("bin", b"1")])])).save(idx_path)
    assert len(ShardIndex.load(idx_path)) == 1


def test_load_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.idx"
    empty.write_bytes(b"")
    with pytest.raises(ShardFormatError, match=r"empty\.idx at byte 0: index file is empty"):
        ShardIndex.load(empty)
    junk = tmp_path / "junk.idx"
    junk.write_bytes(b"not an index at all" * 10)
    with pytest.raises(ShardFormatError, match=r"junk\.idx at byte 0: bad magic"):
        ShardIndex.load(junk)
    with pytest.raises(FileNotFoundError):
        ShardIndex.load(tmp_path / "missing.idx")


def test_build_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.tar"):
        ShardIndex.build(tmp_path / "missing.tar")
    with pytest.raises(OSError, match="Invalid argument"):
        ShardIndex.build(tmp_path)  # a directory


def test_build_rejects_non_contiguous_buffer(small_tar: bytes) -> None:
    strided = memoryview(bytearray(small_tar) * 2)[::2]
    with pytest.raises(TypeError, match="contiguous"):
        ShardIndex.build(strided)


def test_native_scan_returns_owned_numpy_arrays(small_tar: bytes) -> None:
    r = _native.scan(small_tar)
    offsets = r.pop("offsets")
    del r
    assert offsets.dtype == np.uint64
    assert offsets.tolist() == ShardIndex.build(small_tar).offsets.tolist()
    assert offsets[0] == 512
    assert offsets.flags.owndata is False  # owned by the capsule, not copied into numpy


def test_names_survive_non_utf8(tmp_path: Path) -> None:
    raw = tars.raw_member(b"caf\xe9.jpg", b"x") + tars.end_blocks()
    index = ShardIndex.build(raw)
    assert index.key(0) == "caf\udce9"
    assert index.names[0].encode("utf-8", "surrogateescape") == b"caf\xe9.jpg"


def test_write_dali_index(shard: Path, tmp_path: Path) -> None:
    index = ShardIndex.build(shard)
    out = tmp_path / "dali.idx"
    index.write_dali_index(out)
    lines = out.read_text().splitlines()
    assert lines[0] == "v1.2 3"
    first = lines[1].split()
    off, size = index.sample(0)["jpg"]
    assert first[:4] == ["jpg", str(off), str(size), "k0.jpg"]
    assert len(lines) == 4


def test_pickles_even_when_mmapped(shard: Path, tmp_path: Path) -> None:
    import pickle

    idx_path = tmp_path / "shard.idx"
    ShardIndex.build(shard).save(idx_path)
    loaded = ShardIndex.load(idx_path)
    clone = pickle.loads(pickle.dumps(loaded))
    assert clone.to_bytes() == loaded.to_bytes()
    assert clone.name == loaded.name
    assert clone.sample(2) == loaded.sample(2)
