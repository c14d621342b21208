"""fastload.convert.cityscapes: keys, fields, canonical order, refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastload import convert
from fastload.convert import SourceDataError
from fastload.convert.synthetic import make_cityscapes
from fastload.datasets.cityscapes import CITYSCAPES_CLASSES
from fastload.errors import ConfigError
from fastload.shards.manifest import Manifest

from .shard_helpers import read_dataset

FIELDS = {
    "leftImg8bit.png",
    "gtFine_instanceIds.png",
    "gtFine_labelIds.png",
    "gtFine_color.png",
    "gtFine_polygons.json",
}


def expected_stems(root: Path, split: str) -> list[str]:
    base = root / "leftImg8bit" / split
    return [
        name[: -len("_leftImg8bit.png")]
        for city in sorted(os.listdir(base))
        for name in sorted(os.listdir(base / city))
    ]


@pytest.fixture
def cs_root(tmp_path: Path) -> Path:
    return Path(
        make_cityscapes(tmp_path / "cs", split="train", cities=3, per_city=3, size=(48, 24), seed=5)
    )


def test_fields_keys_order_and_bytes(cs_root: Path, tmp_path: Path) -> None:
    report = convert.cityscapes(str(cs_root), str(tmp_path / "out"), progress=False)
    manifest, samples = read_dataset(tmp_path / "out")
    stems = expected_stems(cs_root, "train")
    assert report.samples == 9
    assert not report.skipped
    assert [s["__key__"] for s in samples] == stems
    assert set(manifest.fields) == FIELDS
    for stem, sample in zip(stems, samples, strict=True):
        city = stem.split("_")[0]
        assert set(sample) == FIELDS | {"__key__"}
        img = cs_root / "leftImg8bit" / "train" / city / f"{stem}_leftImg8bit.png"
        assert sample["leftImg8bit.png"] == img.read_bytes()
        for suffix in ("instanceIds.png", "labelIds.png", "color.png", "polygons.json"):
            path = cs_root / "gtFine" / "train" / city / f"{stem}_gtFine_{suffix}"
            assert sample[f"gtFine_{suffix}"] == path.read_bytes()
    src = manifest.source
    assert src["kind"] == "cityscapes"
    assert src["split"] == "train"
    assert src["mode"] == "fine"
    assert src["cities"] == sorted(os.listdir(cs_root / "leftImg8bit" / "train"))
    assert len(src["classes"]) == 35 == len(CITYSCAPES_CLASSES)
    assert src["classes"][26]["name"] == "car"
    assert src["classes"][26]["id"] == 26


def test_coarse_mode_and_other_splits(tmp_path: Path) -> None:
    root = make_cityscapes(
        tmp_path / "cs", split="train_extra", per_city=2, size=(32, 16), mode="coarse"
    )
    report = convert.cityscapes(
        root, str(tmp_path / "out"), split="train_extra", mode="coarse", progress=False
    )
    assert report.samples == 4
    assert set(report.manifest.fields) == {f.replace("gtFine", "gtCoarse") for f in FIELDS}
    with pytest.raises(SourceDataError, match="directory does not exist"):
        convert.cityscapes(root, str(tmp_path / "o2"), split="val", mode="coarse", progress=False)


@pytest.mark.parametrize(
    ("split", "mode", "message"),
    [
        ("train", "medium", "argument mode"),
        ("train_extra", "fine", "argument split if mode is 'fine'"),
        ("test", "coarse", "argument split if mode is 'coarse'"),
    ],
)
def test_bad_split_or_mode(tmp_path: Path, split: str, mode: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        convert.cityscapes(str(tmp_path), str(tmp_path / "out"), split=split, mode=mode)
    with pytest.raises(ValueError, match=message):  # torchvision raises ValueError
        convert.cityscapes(str(tmp_path), str(tmp_path / "out"), split=split, mode=mode)


def test_missing_target_is_refused_or_skipped(cs_root: Path, tmp_path: Path) -> None:
    stem = expected_stems(cs_root, "train")[4]
    victim = cs_root / "gtFine" / "train" / stem.split("_")[0] / f"{stem}_gtFine_labelIds.png"
    victim.unlink()
    with pytest.raises(SourceDataError, match="missing") as info:
        convert.cityscapes(str(cs_root), str(tmp_path / "out"), progress=False)
    assert info.value.path == str(victim)
    assert not (tmp_path / "out" / "manifest.json").exists()
    report = convert.cityscapes(
        str(cs_root), str(tmp_path / "out"), on_error="skip", progress=False
    )
    assert report.samples == 8
    assert [(s.item, s.path) for s in report.skipped] == [(stem, str(victim))]
    _, samples = read_dataset(tmp_path / "out")
    assert stem not in [s["__key__"] for s in samples]


def test_corrupt_png_and_malformed_polygons(cs_root: Path, tmp_path: Path) -> None:
    stems = expected_stems(cs_root, "train")
    city = stems[0].split("_")[0]
    png = cs_root / "gtFine" / "train" / city / f"{stems[0]}_gtFine_instanceIds.png"
    png.write_bytes(png.read_bytes()[:60])
    with pytest.raises(SourceDataError) as info:
        convert.cityscapes(str(cs_root), str(tmp_path / "out"), progress=False)
    assert info.value.path == str(png)

    poly = cs_root / "gtFine" / "train" / city / f"{stems[1]}_gtFine_polygons.json"
    poly.write_text('{"imgHeight": 24, "objects": [')
    report = convert.cityscapes(
        str(cs_root), str(tmp_path / "out"), on_error="skip", progress=False
    )
    assert report.samples == 7
    assert {s.path for s in report.skipped} == {str(png), str(poly)}
    assert any("malformed polygon file" in s.reason for s in report.skipped)


def test_unexpected_files_are_refused(cs_root: Path, tmp_path: Path) -> None:
    city_dir = (
        cs_root / "leftImg8bit" / "train" / sorted(os.listdir(cs_root / "leftImg8bit" / "train"))[0]
    )
    (city_dir / "notes.txt").write_text("hello")
    with pytest.raises(SourceDataError, match="unexpected file"):
        convert.cityscapes(str(cs_root), str(tmp_path / "out"), progress=False)
    report = convert.cityscapes(
        str(cs_root), str(tmp_path / "out"), on_error="skip", progress=False
    )
    assert report.samples == 9


def test_several_shards(cs_root: Path, tmp_path: Path) -> None:
    report = convert.cityscapes(
        str(cs_root), str(tmp_path / "out"), shard_size="20KB", progress=False
    )
    manifest = Manifest.load(str(tmp_path / "out"))
    assert len(manifest.shards) >= 3
    assert manifest.num_samples == sum(s.samples for s in manifest.shards) == 9
    assert report.manifest.num_samples == 9
