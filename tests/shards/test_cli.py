"""``fastload index`` and ``fastload inspect`` on real shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastload.cli import main
from fastload.shards.index import ShardIndex
from fastload.shards.writer import ShardWriter


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    with ShardWriter(str(root), shard_size="4KB", source={"kind": "test", "note": "x"}) as w:
        for i in range(12):
            w.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 900, "cls": i % 3})
    return root


def test_index_writes_sidecars_and_dali_index(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = sorted(dataset.glob("*.tar"))
    for s in shards:
        (s.parent / (s.name + ".idx")).unlink()
    assert main(["index", "--dali", *map(str, shards)]) == 0
    out = capsys.readouterr().out
    assert f"{shards[0]}: " in out
    for s in shards:
        idx = ShardIndex.load(str(s) + ".idx")
        assert idx.num_samples == ShardIndex.build(str(s)).num_samples
        dali = (s.parent / (s.name + ".dali.idx")).read_text().splitlines()
        assert dali[0] == f"v1.2 {idx.num_samples}"


def test_index_reports_a_bad_shard_and_goes_on(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"\x01" * 1024)
    good = sorted(dataset.glob("*.tar"))[0]
    assert main(["index", "--json", str(bad), str(good)]) == 1
    captured = capsys.readouterr()
    assert "bad.tar" in captured.err
    doc = json.loads(captured.out)
    assert "error" in doc["shards"][0]
    assert doc["shards"][1]["samples"] > 0


def test_inspect_dataset_and_shard(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--json", str(dataset)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "dataset"
    assert doc["samples"] == 12
    assert doc["fields"] == ["bin", "cls"]
    assert doc["source"]["kind"] == "test"
    assert main(["inspect", str(dataset)]) == 0
    text = capsys.readouterr().out
    assert "samples  12" in text
    shard = sorted(dataset.glob("*.tar"))[0]
    assert main(["inspect", "--json", str(shard)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "shard"
    assert doc["indexed_from"] == "sidecar"
    assert doc["fields"]["bin"]["bytes"] == 900 * doc["samples"]
    assert doc["first_keys"][0] == "k000"


def test_inspect_missing_dataset_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path / "nope")]) == 1
    assert "manifest.json" in capsys.readouterr().err


def test_index_gzipped_shard_indexes_the_decompressed_tar(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    shard = sorted(dataset.glob("*.tar"))[0]
    gz = tmp_path / "s.tar.gz"
    gz.write_bytes(gzip.compress(shard.read_bytes()))
    assert main(["index", "--dali", "--json", str(gz)]) == 0
    captured = capsys.readouterr()
    assert "no DALI index for a gzipped shard" in captured.err
    idx = ShardIndex.load(str(gz) + ".idx")
    assert idx.to_bytes() == ShardIndex.build(str(shard)).to_bytes()
    assert not (tmp_path / "s.tar.gz.dali.idx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "s.tar.gz", "s.tar.gz.idx"]
    (tmp_path / "t.tgz").write_bytes(gzip.compress(shard.read_bytes())[:-30])
    assert main(["index", str(tmp_path / "t.tgz")]) == 1
    assert "ends early" in capsys.readouterr().err


def test_inspect_refuses_a_stale_sidecar(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a shard cut after indexing: its sidecar describes another size and is not trusted
    import shutil

    shards = sorted(dataset.glob("*.tar"))
    copy = tmp_path / "cut.tar"
    shutil.copy(shards[0], copy)
    shutil.copy(str(shards[0]) + ".idx", str(copy) + ".idx")
    with open(copy, "r+b") as f:
        f.truncate(copy.stat().st_size - 1024)
    assert main(["inspect", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "stale index" in err
    assert "cut.tar.idx" in err
