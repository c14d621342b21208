"""fastload.convert.folder: ImageFolder's classes and order, cls labels, bad images."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastload import convert
from fastload.convert import IMG_EXTENSIONS, SourceDataError
from fastload.convert.synthetic import make_folder

from .shard_helpers import read_dataset


def image_folder_reference(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision's find_classes + make_dataset, from its source."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    instances = []
    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    instances.append((os.path.join(dirpath, fname), class_to_idx[target_class]))
    return classes, instances


def test_classes_order_and_labels_match_image_folder(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "src", classes=4, per_class=5)
    report = convert.folder(root, str(tmp_path / "out"), progress=False, shard_size="8KB")
    manifest, samples = read_dataset(tmp_path / "out")
    classes, instances = image_folder_reference(root)
    assert manifest.source["classes"] == classes == ["apple", "kiwi", "mango", "zebra"]
    assert report.samples == len(samples) == len(instances) == 20
    assert len(manifest.shards) > 1
    assert [s["__key__"] for s in samples] == [f"{i:08d}" for i in range(20)]
    for (path, label), sample in zip(instances, samples, strict=True):
        ext = os.path.splitext(path)[1][1:]
        assert set(sample) == {"__key__", ext, "cls"}
        assert sample[ext] == Path(path).read_bytes()
        assert int(sample["cls"]) == label
    assert any("nested" in p for p, _ in instances)
    assert set(manifest.fields) == {"cls", "jpg", "png"}


def test_corrupt_image_is_refused_or_skipped(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "src", classes=2, per_class=3)
    _, instances = image_folder_reference(root)
    victim = instances[2][0]
    Path(victim).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(SourceDataError) as info:
        convert.folder(root, str(tmp_path / "out"), progress=False)
    assert info.value.path == victim
    report = convert.folder(root, str(tmp_path / "out"), on_error="skip", progress=False)
    assert report.samples == 5
    assert [s.path for s in report.skipped] == [victim]
    _, samples = read_dataset(tmp_path / "out")
    assert [int(s["cls"]) for s in samples] == [label for p, label in instances if p != victim]


def test_empty_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(SourceDataError, match="does not exist"):
        convert.folder(str(tmp_path / "nope"), str(tmp_path / "out"), progress=False)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"")
    with pytest.raises(SourceDataError, match="no class folders"):
        convert.folder(str(tmp_path / "flat"), str(tmp_path / "out"), progress=False)
