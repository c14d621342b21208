"""The synthetic generators write the real formats, with the edge cases they promise."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from fastload.convert.synthetic import COCO_CATEGORIES, make_cityscapes, make_coco, make_folder


def test_make_coco_is_real_coco_with_edge_cases(tmp_path: Path) -> None:
    images_dir, ann_path = make_coco(tmp_path, num_images=40, size=(96, 72), seed=3)
    doc = json.loads(Path(ann_path).read_text())
    ids = [img["id"] for img in doc["images"]]
    assert len(ids) == len(set(ids)) == 40
    assert ids != sorted(ids), "images must be listed out of id order"
    assert sorted(ids) != list(range(min(ids), min(ids) + 40)), "ids must have gaps"
    cat_ids = sorted(c["id"] for c in doc["categories"])
    assert cat_ids == sorted(c["id"] for c in COCO_CATEGORIES)
    assert cat_ids != list(range(1, len(cat_ids) + 1))

    coco = COCO(ann_path)
    per_image = [len(coco.getAnnIds(imgIds=i)) for i in ids]
    assert 0 in per_image, "some image must have no annotation"
    crowd = [a for a in doc["annotations"] if a["iscrowd"]]
    assert crowd, "some annotation must be a crowd RLE"
    for ann in crowd:
        h, w = ann["segmentation"]["size"]
        assert sum(ann["segmentation"]["counts"]) == h * w
        rle = mask_utils.frPyObjects(ann["segmentation"], h, w)
        assert int(mask_utils.area(rle)) == ann["area"]
    modes = set()
    for img in doc["images"]:
        with Image.open(os.path.join(images_dir, img["file_name"])) as im:
            assert im.format == "JPEG"
            assert im.size == (img["width"], img["height"])
            modes.add(im.mode)
    assert modes == {"RGB", "L"}
    for ann in doc["annotations"]:
        x, y, bw, bh = ann["bbox"]
        img = coco.imgs[ann["image_id"]]
        assert x >= 0
        assert y >= 0
        assert x + bw <= img["width"]
        assert y + bh <= img["height"]
        assert ann["category_id"] in cat_ids


def test_make_coco_is_deterministic(tmp_path: Path) -> None:
    a = make_coco(tmp_path / "a", num_images=5, size=(32, 24), seed=7)
    b = make_coco(tmp_path / "b", num_images=5, size=(32, 24), seed=7)
    assert Path(a[1]).read_bytes() == Path(b[1]).read_bytes()
    for name in sorted(os.listdir(a[0])):
        assert (Path(a[0]) / name).read_bytes() == (Path(b[0]) / name).read_bytes()


def test_make_cityscapes_layout_and_modes(tmp_path: Path) -> None:
    root = Path(make_cityscapes(tmp_path, split="val", cities=2, per_city=3, size=(64, 32)))
    cities = sorted(os.listdir(root / "leftImg8bit" / "val"))
    assert len(cities) == 2
    saw_instances = False
    for city in cities:
        files = sorted(os.listdir(root / "leftImg8bit" / "val" / city))
        assert len(files) == 3
        for name in files:
            assert name.startswith(city + "_")
            assert name.endswith("_leftImg8bit.png")
            stem = name[: -len("_leftImg8bit.png")]
            _, seq, frame = stem.split("_")
            assert len(seq) == 6
            assert len(frame) == 6
            gt = root / "gtFine" / "val" / city
            with Image.open(root / "leftImg8bit" / "val" / city / name) as im:
                assert im.mode == "RGB"
                assert im.size == (64, 32)
            with Image.open(gt / f"{stem}_gtFine_labelIds.png") as im:
                assert im.mode == "L"
                labels = np.array(im)
            with Image.open(gt / f"{stem}_gtFine_instanceIds.png") as im:
                assert im.mode in ("I", "I;16")  # 16-bit PNG; Pillow >= 10 opens it as I;16
                inst = np.array(im).astype(np.int64)
            with Image.open(gt / f"{stem}_gtFine_color.png") as im:
                assert im.mode == "RGBA"
            poly = json.loads((gt / f"{stem}_gtFine_polygons.json").read_text())
            assert poly["imgWidth"] == 64
            assert poly["imgHeight"] == 32
            assert poly["objects"]
            big = inst >= 1000
            saw_instances |= bool(big.any())
            np.testing.assert_array_equal(inst[big] // 1000, labels[big])
            np.testing.assert_array_equal(inst[~big], labels[~big])
    assert saw_instances, "instance ids like 26001 must occur"


def test_make_folder(tmp_path: Path) -> None:
    root = Path(make_folder(tmp_path, classes=3, per_class=4))
    assert sorted(os.listdir(root)) == ["apple", "mango", "zebra"]
    for cls in ("apple", "mango", "zebra"):
        found = [f for _, _, fs in os.walk(root / cls) for f in fs]
        assert len([f for f in found if f.endswith((".jpg", ".png"))]) == 4
        assert "README.txt" in found
        assert (root / cls / "nested").is_dir()
