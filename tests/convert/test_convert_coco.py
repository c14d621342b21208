"""fastload.convert.coco: samples, order, manifest, and the refusal of bad inputs."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from pycocotools.coco import COCO

from fastload import convert
from fastload.convert import SourceDataError
from fastload.convert.synthetic import make_coco
from fastload.errors import ConfigError
from fastload.shards.manifest import Manifest

from .shard_helpers import read_dataset


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return make_coco(tmp_path_factory.mktemp("coco"), num_images=30, size=(96, 72), seed=1)


@pytest.fixture
def small_coco(tmp_path: Path) -> tuple[str, str]:
    """A fresh dataset a test may break."""
    return make_coco(tmp_path / "src", num_images=8, size=(48, 32), seed=2)


def test_samples_match_pycocotools_in_ascending_id(
    coco_src: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = coco_src
    report = convert.coco(images, ann, str(tmp_path / "out"), progress=False, workers=3)
    manifest, samples = read_dataset(tmp_path / "out")
    ref = COCO(ann)
    ids = sorted(ref.imgs)
    assert report.samples == len(samples) == len(ids) == 30
    assert report.skipped == []
    assert [s["__key__"] for s in samples] == [f"{i:012d}" for i in ids]
    assert manifest.source["image_ids"] == ids
    for image_id, sample in zip(ids, samples, strict=True):
        img = ref.imgs[image_id]
        assert set(sample) == {"__key__", "jpg", "json"}
        assert sample["jpg"] == Path(images, img["file_name"]).read_bytes()
        doc = json.loads(sample["json"])
        assert doc["image"] == img
        assert doc["annotations"] == ref.loadAnns(ref.getAnnIds(imgIds=image_id))
    src_doc = json.loads(Path(ann).read_text())
    assert manifest.source["kind"] == "coco"
    assert manifest.source["categories"] == src_doc["categories"]
    assert manifest.source["licenses"] == src_doc["licenses"]
    assert manifest.source["info"] == src_doc["info"]
    assert manifest.fields == ("jpg", "json")


def test_small_shard_size_makes_several_shards_that_add_up(
    coco_src: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = coco_src
    report = convert.coco(images, ann, str(tmp_path / "out"), shard_size="40KB", progress=False)
    manifest = Manifest.load(str(tmp_path / "out"))
    assert len(manifest.shards) >= 3
    assert manifest.num_samples == sum(s.samples for s in manifest.shards) == 30
    assert report.manifest.to_dict() == manifest.to_dict()
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert doc["totals"] == {
        "shards": len(manifest.shards),
        "samples": 30,
        "bytes": sum(os.path.getsize(tmp_path / "out" / s.name) for s in manifest.shards),
    }
    _, samples = read_dataset(tmp_path / "out")
    assert [int(s["__key__"]) for s in samples] == sorted(COCO(ann).imgs)


def test_output_does_not_depend_on_worker_count(coco_src: tuple[str, str], tmp_path: Path) -> None:
    images, ann = coco_src
    one = convert.coco(images, ann, str(tmp_path / "a"), workers=1, progress=False)
    many = convert.coco(images, ann, str(tmp_path / "b"), workers=6, progress=False)
    assert [s.checksum for s in one.manifest.shards] == [s.checksum for s in many.manifest.shards]


def test_missing_image_is_refused_naming_the_file(
    small_coco: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images, ann = small_coco
    victim = sorted(os.listdir(images))[3]
    os.unlink(os.path.join(images, victim))
    out = tmp_path / "out"
    with pytest.raises(SourceDataError, match=victim) as info:
        convert.coco(images, ann, str(out), progress=False)
    assert "missing" in str(info.value)
    assert not (out / "manifest.json").exists()

    report = convert.coco(images, ann, str(out), on_error="skip", progress=True)
    assert victim in capsys.readouterr().err  # the printed summary lists it
    assert report.samples == 7
    assert len(report.skipped) == 1
    assert report.skipped[0].path == os.path.join(images, victim)
    assert f"{int(victim.split('.')[0])}" in report.skipped[0].item
    assert victim in report.summary()
    manifest, samples = read_dataset(out)
    assert f"{victim.split('.')[0]}" not in [s["__key__"] for s in samples]
    assert manifest.source["skipped"] == 1
    assert len(manifest.source["image_ids"]) == 7


def test_annotation_of_unknown_image_is_refused(
    small_coco: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = small_coco
    doc = json.loads(Path(ann).read_text())
    stray = dict(doc["annotations"][0], id=999_999_999, image_id=123_456_789)
    doc["annotations"].append(stray)
    Path(ann).write_text(json.dumps(doc))
    with pytest.raises(SourceDataError, match=r"999999999.*123456789") as info:
        convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    assert ann in str(info.value)
    report = convert.coco(images, ann, str(tmp_path / "out"), on_error="skip", progress=False)
    assert report.samples == 8
    assert [s.item for s in report.skipped] == ["annotation 999999999"]
    _, samples = read_dataset(tmp_path / "out")
    all_ann_ids = {a["id"] for s in samples for a in json.loads(s["json"])["annotations"]}
    assert 999_999_999 not in all_ann_ids
    assert len(all_ann_ids) == len(doc["annotations"]) - 1


def test_corrupt_jpeg_is_refused_and_no_manifest_written(
    small_coco: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = small_coco
    victim = os.path.join(images, sorted(os.listdir(images))[5])
    data = Path(victim).read_bytes()
    Path(victim).write_bytes(data[: len(data) // 2])  # truncated JPEG
    out = tmp_path / "out"
    with pytest.raises(SourceDataError, match="corrupt image") as info:
        convert.coco(images, ann, str(out), progress=False, workers=2)
    assert info.value.path == victim
    assert not (out / "manifest.json").exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload-convert")]

    report = convert.coco(images, ann, str(out), on_error="skip", progress=False)
    assert report.samples == 7
    assert [s.path for s in report.skipped] == [victim]
    assert (out / "manifest.json").exists()


def test_garbage_image_is_refused(small_coco: tuple[str, str], tmp_path: Path) -> None:
    images, ann = small_coco
    victim = os.path.join(images, sorted(os.listdir(images))[0])
    Path(victim).write_bytes(b"this is not a JPEG at all" * 10)
    with pytest.raises(SourceDataError, match="not an image") as info:
        convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    assert info.value.path == victim


def test_malformed_json_is_refused_with_line_and_column(
    small_coco: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = small_coco
    Path(ann).write_text('{"images": [\n  {"id": 1,, "file_name": "x.jpg"}]}')
    with pytest.raises(SourceDataError, match=r"malformed COCO annotation file.*line 2") as info:
        convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    assert info.value.path == ann
    # Malformed JSON is not a per-item problem: skipping cannot help.
    with pytest.raises(SourceDataError, match="malformed"):
        convert.coco(images, ann, str(tmp_path / "out"), on_error="skip", progress=False)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], "must be a JSON object"),
        ({"images": {"id": 1}}, "'images' must be a list"),
        (
            {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 1, "file_name": "b.jpg"}]},
            "image id 1 appears more than once",
        ),
    ],
)
def test_malformed_structure_is_refused(
    small_coco: tuple[str, str], tmp_path: Path, doc: Any, message: str
) -> None:
    images, ann = small_coco
    Path(ann).write_text(json.dumps(doc))
    with pytest.raises(SourceDataError, match=message):
        convert.coco(images, ann, str(tmp_path / "out"), on_error="skip", progress=False)


def test_entries_without_ids_are_refused_or_skipped(
    small_coco: tuple[str, str], tmp_path: Path
) -> None:
    images, ann = small_coco
    doc = json.loads(Path(ann).read_text())
    doc["images"].append({"file_name": "nope.jpg"})
    doc["annotations"].append({"image_id": doc["images"][0]["id"]})
    Path(ann).write_text(json.dumps(doc))
    with pytest.raises(SourceDataError, match=r"images\[8\] has no integer 'id'"):
        convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    report = convert.coco(images, ann, str(tmp_path / "out"), on_error="skip", progress=False)
    assert report.samples == 8
    assert len(report.skipped) == 2


def test_missing_inputs_and_bad_arguments(small_coco: tuple[str, str], tmp_path: Path) -> None:
    images, ann = small_coco
    with pytest.raises(SourceDataError, match="annotation file is missing"):
        convert.coco(images, str(tmp_path / "nope.json"), str(tmp_path / "o"), progress=False)
    with pytest.raises(SourceDataError, match="image directory does not exist"):
        convert.coco(str(tmp_path / "nope"), ann, str(tmp_path / "o"), progress=False)
    with pytest.raises(ConfigError, match="on_error"):
        convert.coco(images, ann, str(tmp_path / "o"), on_error="ignore", progress=False)
    with pytest.raises(ConfigError, match="workers"):
        convert.coco(images, ann, str(tmp_path / "o"), workers=0, progress=False)


def test_images_in_subdirectories_and_other_extensions(tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=4, size=(40, 30), seed=4)
    doc = json.loads(Path(ann).read_text())
    os.makedirs(os.path.join(images, "sub"))
    first = doc["images"][0]
    shutil.move(os.path.join(images, first["file_name"]), os.path.join(images, "sub", "a.JPEG"))
    first["file_name"] = "sub/a.JPEG"
    Path(ann).write_text(json.dumps(doc))
    convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    manifest, samples = read_dataset(tmp_path / "out")
    by_key = {s["__key__"]: s for s in samples}
    moved = by_key[f"{first['id']:012d}"]
    assert set(moved) == {"__key__", "jpeg", "json"}
    assert moved["jpeg"] == Path(images, "sub", "a.JPEG").read_bytes()
    assert set(manifest.fields) == {"jpg", "jpeg", "json"}
