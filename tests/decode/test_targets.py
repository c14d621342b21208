"""COCO detection targets against pycocotools (``annToMask``) on a synthetic dataset."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import pytest
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO

from fastload.decode import category_map, coco_targets
from fastload.errors import ConfigError, DecodeError

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

H, W = 60, 80


def _polygon(rng: np.random.Generator) -> list[float]:
    cx, cy = rng.uniform(10, W - 10), rng.uniform(10, H - 10)
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 12))))
    radii = rng.uniform(3, 25, angles.size)
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1).ravel().tolist()


def _bbox_of(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [
        float(xs.min()),
        float(ys.min()),
        float(xs.max() - xs.min() + 1),
        float(ys.max() - ys.min() + 1),
    ]


def _dataset() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    anns: list[dict[str, Any]] = []
    categories = [{"id": cid, "name": f"c{cid}", "supercategory": "x"} for cid in (1, 3, 18, 90)]
    for i in range(6):
        polys = [_polygon(rng) for _ in range(int(rng.integers(1, 3)))]
        mask = np.asarray(coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(polys, H, W))))
        anns.append(
            {
                "id": 100 + i,
                "image_id": 42,
                "category_id": categories[i % 4]["id"],
                "segmentation": polys,
                "area": float(mask.sum()),
                "bbox": _bbox_of(mask),
                "iscrowd": 0,
            }
        )
    crowd = np.zeros((H, W), dtype=np.uint8)
    crowd[5:40, 30:75] = 1
    flat = crowd.T.ravel()
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    anns.append(
        {
            "id": 200,
            "image_id": 42,
            "category_id": 1,
            "segmentation": {"size": [H, W], "counts": np.diff(bounds).tolist()},
            "area": float(crowd.sum()),
            "bbox": _bbox_of(crowd),
            "iscrowd": 1,
        }
    )
    blob = np.zeros((H, W), dtype=np.uint8)
    blob[20:30, 2:12] = 1
    rle = coco_mask.encode(np.asfortranarray(blob))
    anns.append(
        {
            "id": 201,
            "image_id": 42,
            "category_id": 90,
            "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()},
            "area": float(blob.sum()),
            "bbox": _bbox_of(blob),
            "iscrowd": 0,
        }
    )
    return {
        "images": [{"id": 42, "file_name": "000000000042.jpg", "height": H, "width": W}],
        "annotations": anns,
        "categories": categories,
    }


@pytest.fixture(scope="module")
def coco() -> COCO:
    api = COCO()
    api.dataset = _dataset()
    with contextlib.redirect_stdout(io.StringIO()):
        api.createIndex()
    return api


@pytest.fixture(scope="module")
def anns(coco: COCO) -> list[dict[str, Any]]:
    return coco.loadAnns(coco.getAnnIds(imgIds=42))


@pytest.mark.parametrize("backend", ["numpy", "pycocotools"])
def test_masks_match_ann_to_mask(coco: COCO, anns: list[dict[str, Any]], backend: str) -> None:
    t = coco_targets(anns, height=H, width=W, masks=True, mask_backend=backend, as_tensor=False)
    assert t["masks"].shape == (len(anns), H, W)
    assert t["masks"].dtype == np.uint8
    for i, ann in enumerate(anns):
        assert np.array_equal(t["masks"][i], coco.annToMask(ann)), ann["id"]
    assert t["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
    assert 1 in t["iscrowd"].tolist()


def test_boxes_labels_area_image_id(anns: list[dict[str, Any]]) -> None:
    t = coco_targets(anns, height=H, width=W)
    boxes = t["boxes"].numpy()
    assert boxes.dtype == np.float32
    assert boxes.shape == (len(anns), 4)
    for box, ann in zip(boxes, anns, strict=True):
        x, y, w, h = ann["bbox"]
        assert box.tolist() == pytest.approx([x, y, x + w, y + h])
    assert str(t["labels"].dtype) == "torch.int64"
    assert t["labels"].tolist() == [a["category_id"] for a in anns]
    assert t["area"].tolist() == pytest.approx([a["area"] for a in anns])
    assert t["image_id"] == 42
    assert "masks" not in t
    xywh = coco_targets(anns, height=H, width=W, box_format="xywh", as_tensor=False)
    assert np.allclose(xywh["boxes"], np.array([a["bbox"] for a in anns], dtype=np.float32))


def test_contiguous_labels(coco: COCO, anns: list[dict[str, Any]]) -> None:
    mapping = category_map(coco.dataset["categories"])
    assert mapping == {1: 1, 3: 2, 18: 3, 90: 4}
    assert category_map(coco.dataset["categories"], start=0)[90] == 3
    t = coco_targets(anns, height=H, width=W, label_map=mapping, as_tensor=False)
    assert t["labels"].tolist() == [mapping[a["category_id"]] for a in anns]
    with pytest.raises(DecodeError, match=r"category_id 90 not in label_map"):
        coco_targets(anns, height=H, width=W, label_map={1: 1, 3: 2, 18: 3}, name="000042")
    with pytest.raises(ConfigError):
        category_map([{"id": 1}, {"id": 1}])


def test_targets_scale_with_resize(coco: COCO, anns: list[dict[str, Any]]) -> None:
    out_h, out_w = 30, 120  # non-uniform on purpose: x * 1.5, y * 0.5
    t = coco_targets(anns, height=H, width=W, out_size=(out_h, out_w), masks=True, as_tensor=False)
    for box, ann in zip(t["boxes"], anns, strict=True):
        x, y, w, h = ann["bbox"]
        assert box.tolist() == pytest.approx([1.5 * x, 0.5 * y, 1.5 * (x + w), 0.5 * (y + h)])
    assert t["area"].tolist() == pytest.approx([0.75 * a["area"] for a in anns])
    from PIL import Image

    assert t["masks"].shape == (len(anns), out_h, out_w)
    for i, ann in enumerate(anns):
        full = Image.fromarray(coco.annToMask(ann))
        expected = np.asarray(full.resize((out_w, out_h), Image.Resampling.NEAREST))
        assert np.array_equal(t["masks"][i], expected)


def test_no_annotations() -> None:
    t = coco_targets([], height=H, width=W, image_id=7, masks=True)
    assert tuple(t["boxes"].shape) == (0, 4)
    assert tuple(t["labels"].shape) == (0,)
    assert tuple(t["masks"].shape) == (0, H, W)
    assert t["image_id"] == 7


def test_malformed_annotation_names_the_sample() -> None:
    with pytest.raises(DecodeError, match=r"annotation 0 of '000042'.*bbox"):
        coco_targets([{"category_id": 1}], height=H, width=W, name="000042")
    with pytest.raises(DecodeError, match=r"annotation 0 of '000042'.*cover"):
        coco_targets(
            [
                {
                    "bbox": [0, 0, 1, 1],
                    "category_id": 1,
                    "segmentation": {"size": [H, W], "counts": [5]},
                }
            ],
            height=H,
            width=W,
            masks=True,
            name="000042",
        )
    with pytest.raises(ConfigError):
        coco_targets([], height=H, width=W, box_format="cxcywh")
