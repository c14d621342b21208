"""ShardWriter → tar shards + sidecars + manifest; ShardReader reads them back unchanged."""

from __future__ import annotations

import json
import os
import random
import tarfile
from pathlib import Path

import pytest

from fastload.errors import ConfigError, ShardFormatError
from fastload.shards.checksum import file_checksum, xxh3_128
from fastload.shards.index import ShardIndex
from fastload.shards.manifest import Manifest
from fastload.shards.reader import ShardReader
from fastload.shards.writer import ShardWriter


def make_samples(n: int, seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for i in range(n):
        out.append(
            {
                "__key__": f"{i:06d}",
                "jpg": rng.randbytes(rng.choice([0, 1, 511, 512, 513, 3000])),
                "json": {"id": i, "name": f"sample {i}", "boxes": [[1, 2, 3, 4]] * (i % 3)},
                "cls": i % 7,
                "txt": f"caption {i} ünïcode",
            }
        )
    return out


def encoded(sample: dict[str, object]) -> dict[str, bytes]:
    out = {}
    for k, v in sample.items():
        if k == "__key__":
            continue
        if isinstance(v, bytes):
            out[k] = v
        elif isinstance(v, dict):
            out[k] = json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()
        elif isinstance(v, int):
            out[k] = str(v).encode()
        else:
            out[k] = str(v).encode()
    return out


def read_all(root: Path) -> list[dict[str, bytes]]:
    m = Manifest.from_json((root / "manifest.json").read_text(), str(root))
    got = []
    for info in m.shards:
        with ShardReader(root / info.name) as r:
            for i in range(len(r)):
                s = r[i]
                got.append({k: (v if k == "__key__" else bytes(v)) for k, v in s.items()})
                del s
    return got


def test_round_trip_many_shards(tmp_path: Path) -> None:
    samples = make_samples(200)
    with ShardWriter(str(tmp_path), shard_size="20KB", source={"kind": "test"}) as w:
        for s in samples:
            w.write(s)
    m = w.manifest
    assert m is not None
    assert len(m.shards) > 5
    assert m.num_samples == 200
    assert m.fields == ("cls", "jpg", "json", "txt")
    assert m.source == {"kind": "test"}
    assert [s.name for s in m.shards] == [f"shard-{k:06d}.tar" for k in range(len(m.shards))]
    on_disk = Manifest.from_json((tmp_path / "manifest.json").read_text(), str(tmp_path))
    assert on_disk.shards == m.shards
    for info in m.shards:
        path = tmp_path / info.name
        assert file_checksum(path) == (info.bytes, info.checksum)
        idx = (tmp_path / info.index_name).read_bytes()
        assert (len(idx), xxh3_128(idx)) == (info.index_bytes, info.index_checksum)
        # a shard only overflows the limit when a single sample does
        assert info.bytes <= 20_000 + 1024 or info.samples == 1
    # local shards are renamed into place: no temporary files are left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["manifest.json"] + [s.name for s in m.shards] + [s.index_name for s in m.shards]
    )
    got = read_all(tmp_path)
    assert [g["__key__"] for g in got] == [s["__key__"] for s in samples]
    for g, s in zip(got, samples, strict=True):
        assert {k: v for k, v in g.items() if k != "__key__"} == encoded(s)


def test_shards_are_plain_posix_tar_with_adjacent_members(tmp_path: Path) -> None:
    samples = make_samples(10)
    with ShardWriter(tmp_path.as_uri(), shard_size="1GB") as w:
        for s in samples:
            w.write(s)
    with tarfile.open(tmp_path / "shard-000000.tar") as tf:
        names = tf.getnames()
        assert all(m.isfile() for m in tf.getmembers())
        assert tf.extractfile(names[0]).read() == samples[0]["jpg"]  # type: ignore[union-attr]
    assert names[:4] == ["000000.jpg", "000000.json", "000000.cls", "000000.txt"]
    assert len(names) == 40


def test_long_key_uses_pax_and_reads_back(tmp_path: Path) -> None:
    key = "k" * 180
    with ShardWriter(str(tmp_path)) as w:
        w.write({"__key__": key, "seg.png": b"\x89PNG...", "json": {"a": 1}})
    with tarfile.open(tmp_path / "shard-000000.tar") as tf:
        assert tf.getnames() == [f"{key}.seg.png", f"{key}.json"]
    got = read_all(tmp_path)
    assert got == [{"__key__": key, "seg.png": b"\x89PNG...", "json": b'{"a":1}'}]


def test_reproducible_bytes(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        with ShardWriter(str(tmp_path / sub), shard_size="8KB") as w:
            for s in make_samples(30, seed=3):
                w.write(s)
    a = Manifest.from_json((tmp_path / "a" / "manifest.json").read_text())
    b = Manifest.from_json((tmp_path / "b" / "manifest.json").read_text())
    assert a.shards == b.shards


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"jpg": b"x"}, "non-empty string"),
        ({"__key__": "", "jpg": b"x"}, "non-empty string"),
        ({"__key__": 7, "jpg": b"x"}, "non-empty string"),
        ({"__key__": "a.b", "jpg": b"x"}, "must not contain"),
        ({"__key__": "a/b", "jpg": b"x"}, "must not contain"),
        ({"__key__": "ok"}, "has no fields"),
        ({"__key__": "ok", "a/b": b"x"}, "bad field name"),
        ({"__key__": "ok", "x": 1.5}, "cannot store a float"),
        ({"__key__": "ok", "x": {"a": object()}}, "not JSON-serialisable"),
    ],
)
def test_bad_samples_are_refused(tmp_path: Path, sample: dict[str, object], message: str) -> None:
    w = ShardWriter(str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        w.write(sample)
    w.abort()
    assert not (tmp_path / "manifest.json").exists()


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    def write_twice() -> None:
        with ShardWriter(str(tmp_path), shard_size="1KB") as w:
            w.write({"__key__": "a", "x": b"1"})
            w.write({"__key__": "b", "x": b"2" * 2000})
            w.write({"__key__": "a", "x": b"3"})

    with pytest.raises(ConfigError, match="duplicate sample key 'a'"):
        write_twice()
    # the failed write aborted the dataset: no manifest, so nothing half-written is readable
    assert not (tmp_path / "manifest.json").exists()


def test_metadata_fields_are_not_stored(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path)) as w:
        w.write({"__key__": "a", "__url__": "somewhere", "x": b"1"})
    assert read_all(tmp_path) == [{"__key__": "a", "x": b"1"}]


def test_empty_dataset(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path)):
        pass
    m = Manifest.from_json((tmp_path / "manifest.json").read_text())
    assert m.num_samples == 0
    assert m.shards == ()


def test_bad_shard_size() -> None:
    with pytest.raises(ConfigError, match="shard_size"):
        ShardWriter("memory://x", shard_size="lots")
    with pytest.raises(ConfigError, match="shard_size"):
        ShardWriter("memory://x", shard_size=0)


def test_memory_filesystem() -> None:
    import fsspec

    with ShardWriter("memory://fastload-test/ds", shard_size="4KB") as w:
        for s in make_samples(20):
            w.write(s)
    fs = fsspec.filesystem("memory")
    text = fs.cat_file("/fastload-test/ds/manifest.json")
    m = Manifest.from_json(text, "memory://fastload-test/ds")
    data = fs.cat_file("/fastload-test/ds/" + m.shards[0].name)
    index = ShardIndex.from_bytes(fs.cat_file("/fastload-test/ds/" + m.shards[0].index_name), "m")
    assert index.num_samples == m.shards[0].samples
    first = index.sample(0)
    off, size = first["jpg"]  # type: ignore[misc]
    assert data[off : off + size] == make_samples(1)[0]["jpg"]


def test_reader_zero_copy_and_size_check(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path)) as w:
        for s in make_samples(5):
            w.write(s)
    path = tmp_path / "shard-000000.tar"
    r = ShardReader(path)
    view = r[2]["json"]
    assert isinstance(view, memoryview)
    assert view.readonly
    assert json.loads(bytes(view))["id"] == 2
    del view
    r.close()
    with open(path, "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(ShardFormatError, match="shard-000000.tar"):
        ShardReader(path)
    os.unlink(str(path) + ".idx")
    # without the sidecar the scanner indexes the (still valid) tar itself
    with ShardReader(path) as r2:
        assert len(r2) == 5
