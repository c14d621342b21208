"""Denial of service by a hostile dataset: absurd sample counts, deeply nested JSON,
and an index that belongs to another shard."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from fastload.datasets.sharded import ShardedDataset
from fastload.errors import ShardFormatError
from fastload.shards.manifest import Manifest
from fastload.shards.writer import ShardWriter


def _write_shards(url: str, sizes: tuple[int, ...]) -> dict[str, object]:
    """One ShardWriter per shard, then one manifest listing them all."""
    shards = []
    for k, n in enumerate(sizes):
        part = f"{url}/part{k}"
        with ShardWriter(part) as w:
            for i in range(n):
                w.write({"__key__": f"s{k}-{i:04d}", "bin": f"{k}:{i}".encode()})
        doc = json.loads((Path(part) / "manifest.json").read_text())
        for s in doc["shards"]:
            s["name"] = f"part{k}/{s['name']}"
            s["index"]["name"] = f"part{k}/{s['index']['name']}"
            shards.append(s)
    doc["shards"] = shards
    doc.pop("totals")
    (Path(url) / "manifest.json").write_text(json.dumps(doc))
    return doc


def test_a_sample_count_the_shard_cannot_hold_is_refused_before_any_allocation(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "ds")
    doc = _write_shards(url, (3,))
    doc["shards"][0]["samples"] = 300_000_000  # type: ignore[index]
    (Path(url) / "manifest.json").write_text(json.dumps(doc))
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="300000000 samples cannot fit"):
            ShardedDataset(url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # a 2.4 GB order table was the old answer


def test_deeply_nested_manifest_json_is_a_format_error(tmp_path: Path) -> None:
    text = '{"format": "fastload", "source": ' + "[" * 200_000 + "]" * 200_000 + "}"
    with pytest.raises(ShardFormatError, match="nested too deeply"):
        Manifest.from_json(text, "file:///ds")
    url = tmp_path / "ds"
    url.mkdir()
    (url / "manifest.json").write_text(text)
    with pytest.raises(ShardFormatError, match="nested too deeply"):
        ShardedDataset(str(url))


def test_another_shards_valid_index_is_refused(tmp_path: Path) -> None:
    # The attack: the manifest names shard 1's genuine index (and its checksum) for
    # shard 0, so shard 0's bytes would be read through the wrong member table.
    url = str(tmp_path / "ds")
    doc = _write_shards(url, (4, 9))
    shards = doc["shards"]
    shards[0]["index"] = dict(shards[1]["index"])  # type: ignore[index]
    (Path(url) / "manifest.json").write_text(json.dumps(doc))
    ds = ShardedDataset(url)
    with pytest.raises(ShardFormatError, match="manifest's part0/.* has .* 4 samples"):
        ds[0]
    assert ds[4]["__key__"] == "s1-0000"  # the honest shard still reads


def test_honest_datasets_pass_the_checks(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _write_shards(url, (1, 5))
    ds = ShardedDataset(url)
    assert [ds[i]["__key__"] for i in range(6)] == ["s0-0000"] + [f"s1-{i:04d}" for i in range(5)]
