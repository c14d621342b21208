"""Manifest validation: every malformed manifest is a ShardFormatError naming the file."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fastload.errors import ShardFormatError
from fastload.shards.manifest import Manifest, ShardInfo

CK = "xxh3_128:" + "0" * 32


def _info(name: str, samples: int, nbytes: int) -> ShardInfo:
    return ShardInfo(name, nbytes, samples, CK, name + ".idx", 64, CK)


def _manifest() -> Manifest:
    return Manifest.build(
        [_info("shard-000000.tar", 3, 10240), _info("shard-000001.tar", 2, 20480)],
        ["json", "jpg"],
        {"kind": "coco", "categories": [{"id": 1, "name": "a"}]},
        url="file:///data/x",
    )


def test_round_trip_and_derived_values() -> None:
    m = _manifest()
    back = Manifest.from_json(m.to_json(), m.url)
    assert back == m
    assert back.num_samples == 5
    assert back.total_bytes == 30720
    assert back.fields == ("jpg", "json")
    assert list(back.sample_starts) == [0, 3, 5]
    assert [back.locate(i) for i in range(5)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert back.locate(-1) == (1, 1)
    with pytest.raises(IndexError):
        back.locate(5)
    doc = json.loads(m.to_json())
    assert doc["totals"] == {"shards": 2, "samples": 5, "bytes": 30720}
    assert doc["format"] == "fastload"
    assert doc["version"] == 1


def test_empty_manifest() -> None:
    m = Manifest.build([], [], url="memory://e")
    back = Manifest.from_json(m.to_json(), m.url)
    assert back.num_samples == 0
    with pytest.raises(IndexError):
        back.locate(0)


def _broken(edit: Any) -> str:
    doc = json.loads(_manifest().to_json())
    doc = copy.deepcopy(doc)
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="other"), "not a fastload manifest"),
        (lambda d: d.update(version=99), "version 99 is not supported"),
        (lambda d: d.update(shards={}), "'shards' must be a list"),
        (lambda d: d["shards"][0].pop("checksum"), "lacks 'checksum'"),
        (lambda d: d["shards"][0].update(checksum="md5:abc"), "bad checksum"),
        (lambda d: d["shards"][1].update(name="../../etc/passwd"), "bad name"),
        (lambda d: d["shards"][1].update(name="/abs.tar"), "bad name"),
        (lambda d: d["shards"][1].update(samples=-1), "samples must be a non-negative"),
        (lambda d: d["shards"][1].update(bytes="12"), "bytes must be a non-negative"),
        (lambda d: d["shards"][1].update(name="shard-000000.tar"), "not unique"),
        (lambda d: d["totals"].update(samples=6), "totals.samples is 6"),
        (lambda d: d["shards"][0].update(index=None), "index must be an object"),
    ],
)
def test_bad_manifests_name_the_file(edit: Any, message: str) -> None:
    with pytest.raises(ShardFormatError, match="file:///data/x/manifest.json") as info:
        Manifest.from_json(_broken(edit), "file:///data/x")
    assert message in str(info.value)


def test_not_json() -> None:
    with pytest.raises(ShardFormatError, match="not valid JSON"):
        Manifest.from_json(b"{nope", "s3://b/d")
    with pytest.raises(ShardFormatError, match="must be a JSON object"):
        Manifest.from_json("[1]", "s3://b/d")
