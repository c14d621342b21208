"""What the recipes read through ``wrap_dataset_for_transforms_v2`` is the wrapped
drop-in's own object: the wrapper subclasses the drop-in's class, so its lazily built
properties (``CocoDetection.coco``, ``ImageFolder.samples``) run on the wrapper, and
must not build a second copy (reading every shard again) there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fastload
from fastload import convert
from fastload.convert.synthetic import make_coco, make_folder

tv = pytest.importorskip("torchvision", reason="torchvision is not installed")
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap_v2  # noqa: E402


def test_the_wrappers_coco_is_the_datasets(tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=6, size=(40, 30), seed=3)
    convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    ds = fastload.CocoDetection(str(tmp_path / "out"))
    wrapped = wrap_v2(ds)
    assert wrapped.coco is ds.coco  # built through the wrapper first
    other = fastload.CocoDetection(str(tmp_path / "out"))
    assert other.coco is wrap_v2(other).coco  # built on the dataset first
    assert other.coco is not ds.coco


def test_the_wrappers_samples_are_the_datasets(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "src", classes=2, per_class=3, seed=1, size=(24, 16))
    convert.folder(root, str(tmp_path / "out"), progress=False)
    ds = fastload.ImageFolder(str(tmp_path / "out"))
    wrapped = wrap_v2(ds)
    assert wrapped.samples is ds.samples
    assert wrapped.targets == ds.targets == [c for _, c in ds.samples]
    assert len(ds.samples) == 6
