"""fastload.Cityscapes returns what torchvision's Cityscapes returns on the originals.

The reference below is torchvision's ``__init__`` / ``__getitem__`` as its source
reads, so these tests run where torchvision is absent (``test_torchvision_dropins.py``
compares with torchvision itself), with one deliberate change: it sorts
``os.listdir`` (torchvision does not, so its order is the file system's; fastload's
canonical order is sorted).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import convert
from fastload.convert.synthetic import make_cityscapes, make_folder
from fastload.datasets.cityscapes import CITYSCAPES_CLASSES, CityscapesClass
from fastload.errors import ConfigError


class ReferenceCityscapes:
    """torchvision.datasets.Cityscapes, as its source reads (listdir sorted)."""

    def __init__(
        self,
        root: str,
        split: str = "train",
        mode: str = "fine",
        target_type: str | list[str] = "instance",
    ) -> None:
        self.mode = "gtFine" if mode == "fine" else "gtCoarse"
        self.images_dir = os.path.join(root, "leftImg8bit", split)
        self.targets_dir = os.path.join(root, self.mode, split)
        self.target_type = target_type if isinstance(target_type, list) else [target_type]
        self.images: list[str] = []
        self.targets: list[list[str]] = []
        for city in sorted(os.listdir(self.images_dir)):
            img_dir = os.path.join(self.images_dir, city)
            target_dir = os.path.join(self.targets_dir, city)
            for file_name in sorted(os.listdir(img_dir)):
                target_types = []
                for t in self.target_type:
                    target_name = "{}_{}".format(
                        file_name.split("_leftImg8bit")[0], self._get_target_suffix(self.mode, t)
                    )
                    target_types.append(os.path.join(target_dir, target_name))
                self.images.append(os.path.join(img_dir, file_name))
                self.targets.append(target_types)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image = Image.open(self.images[index]).convert("RGB")
        targets: Any = []
        for i, t in enumerate(self.target_type):
            if t == "polygon":
                with open(self.targets[index][i]) as f:
                    target = json.load(f)
            else:
                target = Image.open(self.targets[index][i])
            targets.append(target)
        target = tuple(targets) if len(targets) > 1 else targets[0]
        return image, target

    def __len__(self) -> int:
        return len(self.images)

    @staticmethod
    def _get_target_suffix(mode: str, target_type: str) -> str:
        if target_type == "instance":  # noqa: SIM116 - spelled as torchvision spells it
            return f"{mode}_instanceIds.png"
        elif target_type == "semantic":
            return f"{mode}_labelIds.png"
        elif target_type == "color":
            return f"{mode}_color.png"
        else:
            return f"{mode}_polygons.json"


@pytest.fixture(scope="module")
def cs_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("cityscapes")
    root = make_cityscapes(base / "src", split="val", cities=3, per_city=3, size=(64, 32), seed=9)
    out = str(base / "shards")
    convert.cityscapes(root, out, split="val", shard_size="40KB", progress=False)
    return root, out


def assert_same(a: Any, b: Any) -> None:
    if isinstance(b, Image.Image):
        assert isinstance(a, Image.Image)
        assert a.mode == b.mode
        assert a.size == b.size
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif isinstance(b, tuple):
        assert isinstance(a, tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize(
    "target_type",
    [
        "instance",
        "semantic",
        "color",
        "polygon",
        ["semantic"],
        ["instance", "semantic", "polygon", "color"],
        ["polygon", "instance"],
    ],
)
def test_every_item_equals_torchvision(cs_data: tuple[str, str], target_type: Any) -> None:
    root, out = cs_data
    ref = ReferenceCityscapes(root, split="val", target_type=target_type)
    ds = fastload.Cityscapes(out, split="val", target_type=target_type)
    assert len(ds) == len(ref) == 9
    for i in range(len(ref)):
        image, target = ds[i]
        ref_image, ref_target = ref[i]
        assert image.mode == "RGB"
        assert_same(image, ref_image)
        assert_same(target, ref_target)
        if isinstance(target_type, list) and len(target_type) > 1:
            assert isinstance(target, tuple)
            assert len(target) == len(target_type)


def test_instance_ids_survive(cs_data: tuple[str, str]) -> None:
    _, out = cs_data
    ds = fastload.Cityscapes(out, split="val", target_type=["semantic", "instance"])
    found = set()
    for i in range(len(ds)):
        _, (semantic, instance) = ds[i]
        inst = np.asarray(instance).astype(np.int64)
        found |= set(np.unique(inst[inst >= 1000]).tolist())
        big = inst >= 1000
        np.testing.assert_array_equal(inst[big] // 1000, np.asarray(semantic)[big])
    assert any(v // 1000 == 26 for v in found) or any(v // 1000 == 24 for v in found)


def test_classes_table() -> None:
    classes = fastload.Cityscapes.classes
    assert len(classes) == 35
    assert classes[0] == CityscapesClass("unlabeled", 0, 255, "void", 0, False, True, (0, 0, 0))
    assert classes[26].name == "car"
    assert classes[26].train_id == 13
    assert classes[-1].name == "license plate"
    assert classes[-1].id == -1
    assert [c.id for c in classes[:-1]] == list(range(34))
    assert sorted(c.train_id for c in classes if c.train_id not in (255, -1)) == list(range(19))
    assert classes == list(CITYSCAPES_CLASSES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "bogus"}, "Unknown value 'bogus' for argument split if mode is 'fine'"),
        ({"split": "train_extra"}, "argument split if mode is 'fine'"),
        ({"mode": "medium"}, "Unknown value 'medium' for argument mode"),
        ({"mode": "coarse", "split": "test"}, "argument split if mode is 'coarse'"),
        ({"target_type": "depth"}, "Unknown value 'depth' for argument target_type"),
        ({"target_type": ["semantic", "depth"]}, "argument target_type"),
        ({"target_type": 3}, "Expected type str for argument target_type"),
        ({"transforms": lambda a, b: (a, b), "transform": len}, "Only transforms"),
    ],
)
def test_arguments_are_validated_like_torchvision(
    cs_data: tuple[str, str], kwargs: dict[str, Any], message: str
) -> None:
    _, out = cs_data
    kwargs = {"split": "val", **kwargs}
    with pytest.raises(ValueError, match=message):
        fastload.Cityscapes(out, **kwargs)
    with pytest.raises(ConfigError):
        fastload.Cityscapes(out, **kwargs)


def test_split_must_match_the_converted_one(cs_data: tuple[str, str]) -> None:
    _, out = cs_data
    with pytest.raises(ConfigError, match="holds Cityscapes split 'val'"):
        fastload.Cityscapes(out, split="train")


def test_transforms(cs_data: tuple[str, str]) -> None:
    _, out = cs_data
    plain = fastload.Cityscapes(out, split="val", target_type="polygon")
    ds = fastload.Cityscapes(
        out,
        split="val",
        target_type="polygon",
        transform=lambda im: im.size,
        target_transform=lambda p: p["imgWidth"],
    )
    image, poly = plain[2]
    assert ds[2] == (image.size, poly["imgWidth"])
    joint = fastload.Cityscapes(
        out,
        split="val",
        target_type="polygon",
        transforms=lambda im, p: (im.mode, len(p["objects"])),
    )
    assert joint[2] == ("RGB", len(poly["objects"]))
    assert ds.mode == "gtFine"
    assert ds.target_type == ["polygon"]
    assert ds.split == "val"


def test_coarse(tmp_path: Path) -> None:
    root = make_cityscapes(
        tmp_path / "src", split="train_extra", cities=1, per_city=2, size=(32, 16), mode="coarse"
    )
    convert.cityscapes(
        root, str(tmp_path / "out"), split="train_extra", mode="coarse", progress=False
    )
    ref = ReferenceCityscapes(root, split="train_extra", mode="coarse", target_type="semantic")
    ds = fastload.Cityscapes(
        str(tmp_path / "out"), split="train_extra", mode="coarse", target_type="semantic"
    )
    assert len(ds) == len(ref) == 2
    for i in range(2):
        assert_same(ds[i], ref[i])


def test_refuses_a_dataset_that_is_not_cityscapes(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "src", classes=2, per_class=1)
    convert.folder(root, str(tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match="not a Cityscapes dataset.*fastload convert cityscapes"):
        fastload.Cityscapes(str(tmp_path / "out"), split="val")
