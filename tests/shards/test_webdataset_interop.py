"""fastload shards are read by the webdataset library, and webdataset's are read by fastload."""

from __future__ import annotations

import random
from pathlib import Path

import webdataset as wds

from fastload.shards.manifest import Manifest
from fastload.shards.reader import ShardReader
from fastload.shards.writer import ShardWriter


def _samples(n: int) -> list[dict[str, bytes | str]]:
    rng = random.Random(1)
    return [
        {
            "__key__": f"s{i:05d}",
            "jpg": rng.randbytes(rng.randrange(0, 5000)),
            "seg.png": rng.randbytes(rng.randrange(0, 700)),
            "json": b'{"i": %d}' % i,
        }
        for i in range(n)
    ]


def test_webdataset_reads_fastload_shards(tmp_path: Path) -> None:
    samples = _samples(120)
    with ShardWriter(str(tmp_path), shard_size="60KB") as w:
        for s in samples:
            w.write(s)
    m = Manifest.from_json((tmp_path / "manifest.json").read_text())
    assert len(m.shards) > 2
    urls = [str(tmp_path / s.name) for s in m.shards]
    got = list(wds.WebDataset(urls, shardshuffle=False))
    assert [g["__key__"] for g in got] == [s["__key__"] for s in samples]
    for g, s in zip(got, samples, strict=True):
        for field in ("jpg", "seg.png", "json"):
            assert g[field] == s[field]


def test_fastload_reads_webdataset_shards(tmp_path: Path) -> None:
    samples = _samples(80)
    path = tmp_path / "wds.tar"
    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(s)
    expected = list(wds.WebDataset(str(path), shardshuffle=False))
    with ShardReader(path) as r:
        assert len(r) == len(expected)
        for i, e in enumerate(expected):
            got = r[i]
            assert got["__key__"] == e["__key__"]
            fields = {k for k in e if not k.startswith("__")}
            assert set(got) - {"__key__"} == fields
            for k in fields:
                assert bytes(got[k]) == e[k]  # type: ignore[arg-type]
            del got
