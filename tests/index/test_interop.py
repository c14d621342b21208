"""Interop: webdataset's own reader, DALI's webdataset reader and DALI's wds2idx."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from fastload import ShardIndex

from . import tars


def webdataset_samples(path: Path) -> list[dict[str, object]]:
    """Samples as webdataset itself reads them (no decoding)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as stream:
        files = tar_file_expander([{"url": str(path), "stream": stream}])
        return [
            {k: v for k, v in s.items() if k != "__url__" and k != "__local_path__"}
            for s in group_by_keys(files)
        ]


def index_samples(index: ShardIndex, data: bytes) -> list[dict[str, object]]:
    out = []
    for i in range(len(index)):
        s = index.sample(i)
        out.append({k: (v if k == "__key__" else data[v[0] : v[0] + v[1]]) for k, v in s.items()})
    return out


def test_webdataset_tarwriter_shards_index_like_webdataset_reads_them(tmp_path: Path) -> None:
    import webdataset as wds

    path = tmp_path / "wds-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(40):
            sink.write(
                {
                    "__key__": f"sub/{i:06d}" if i % 3 else f"{i:032x}",
                    "jpg": os.urandom(50 + 13 * i),
                    "json": {"i": i, "name": "x" * i},
                    "seg.png": b"\x89PNG" + bytes(i),
                    "cls": i % 7,
                }
            )
    index = ShardIndex.build(path)
    expected = webdataset_samples(path)
    assert len(expected) == 40
    assert index_samples(index, path.read_bytes()) == expected


def test_webdataset_reads_long_names_like_us(tmp_path: Path) -> None:
    path = tmp_path / "long.tar"
    samples = [(f"{'d' * 120}/{i:04d}", [("jpg", bytes([i]) * i), ("txt", b"t")]) for i in range(5)]
    for fmt, suffix in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
        p = path.with_suffix(f".{suffix}.tar")
        p.write_bytes(tars.samples_tar(samples, fmt))
        assert index_samples(ShardIndex.build(p), p.read_bytes()) == webdataset_samples(p)


def wds2idx(tar: Path, out: Path) -> str:
    from wds2idx import IndexCreator

    with IndexCreator(str(tar), str(out), verbose=False) as creator:
        creator.create_index()
    return out.read_text()


def mixed_samples(n: int) -> list[tuple[str, list[tuple[str, bytes]]]]:
    return [
        (
            f"dir/{i:04d}" if i % 2 else f"{i:08x}",
            [("jpg", os.urandom(100 + 37 * i)), ("json", b'{"i": %d}' % i), ("seg.png", bytes(i))],
        )
        for i in range(n)
    ]


@pytest.mark.dali
def test_dali_index_equals_wds2idx(tmp_path: Path) -> None:
    tar = tmp_path / "shard-000000.tar"
    tar.write_bytes(tars.samples_tar(mixed_samples(12), tarfile.USTAR_FORMAT))
    ours = tmp_path / "ours.idx"
    ShardIndex.build(tar).write_dali_index(ours)
    assert ours.read_text() == wds2idx(tar, tmp_path / "theirs.idx")
    assert ours.read_text().startswith("v1.2 12\n")


@pytest.mark.dali
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_dali_reader_reads_what_our_index_says(tmp_path: Path, fmt: int) -> None:
    from nvidia.dali import fn, pipeline_def

    samples = mixed_samples(9)
    if fmt != tarfile.USTAR_FORMAT:  # extended headers before some members
        samples += [("L" * 150 + "/0001", [("jpg", b"long"), ("json", b"{}"), ("seg.png", b"")])]
    tar = tmp_path / "shard.tar"
    tar.write_bytes(tars.samples_tar(samples, fmt))
    index = ShardIndex.build(tar)
    dali_idx = tmp_path / "shard.dali.idx"
    index.write_dali_index(dali_idx)
    exts = ["jpg", "json", "seg.png"]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)  # type: ignore[call-overload]
    def pipe():  # type: ignore[no-untyped-def]
        return tuple(
            fn.readers.webdataset(
                paths=[str(tar)],
                index_paths=[str(dali_idx)],
                ext=exts,
                missing_component_behavior="error",
            )
        )

    p = pipe()
    p.build()
    data = tar.read_bytes()
    for i in range(len(index)):
        outs = p.run()
        sample = index.sample(i)
        for ext, out in zip(exts, outs, strict=True):
            off, size = sample[ext]
            assert out.at(0).tobytes() == data[off : off + size], (i, ext)


def test_dali_index_refuses_whitespace_names(tmp_path: Path) -> None:
    from fastload import ShardFormatError

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("has space.jpg")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    index = ShardIndex.build(buf.getvalue(), name="ws.tar")
    with pytest.raises(ShardFormatError, match="whitespace"):
        index.write_dali_index(tmp_path / "ws.idx")
    assert not (tmp_path / "ws.idx").exists()
