"""Synthetic datasets in the real on-disk formats of COCO, Cityscapes and image folders.

Used by the tests (so no binary blobs are committed) and by ``fastload demo``. The
data are small but exercise what real datasets have: COCO image ids out of file
order and with gaps, grayscale JPEGs, images without annotations, crowd (RLE)
annotations, non-contiguous category ids; Cityscapes' directory layout with 8-bit
label ids, 16-bit instance ids (``26001`` = car instance 1), RGBA colour images and
polygon JSON. :func:`photo_like` is one photo-like RGB array (smooth colour, hard
edges, noise: COCO-sized as a JPEG), the decode tests' and benchmark's image.
Everything is a pure function of ``seed``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fastload.errors import MissingDependencyError

__all__ = ["COCO_CATEGORIES", "make_cityscapes", "make_coco", "make_folder", "photo_like"]

#: A subset of COCO's categories, with COCO's own non-contiguous ids.
COCO_CATEGORIES: tuple[dict[str, Any], ...] = (
    {"supercategory": "person", "id": 1, "name": "person"},
    {"supercategory": "vehicle", "id": 3, "name": "car"},
    {"supercategory": "animal", "id": 18, "name": "dog"},
    {"supercategory": "animal", "id": 25, "name": "giraffe"},
    {"supercategory": "food", "id": 53, "name": "apple"},
    {"supercategory": "furniture", "id": 62, "name": "chair"},
    {"supercategory": "electronic", "id": 77, "name": "cell phone"},
    {"supercategory": "indoor", "id": 90, "name": "toothbrush"},
)

# (label id, name, has instances, colour) of the Cityscapes classes the generator paints.
_CS_SKY = (23, (70, 130, 180))
_CS_ROAD = (7, (128, 64, 128))
_CS_BUILDING = (11, (70, 70, 70))
_CS_OBJECTS = (
    (24, "person", (220, 20, 60)),
    (26, "car", (0, 0, 142)),
    (33, "bicycle", (119, 11, 32)),
)
_CS_STUFF = ((21, "vegetation", (107, 142, 35)), (17, "pole", (153, 153, 153)))
_CS_NAMES = {23: "sky", 7: "road", 11: "building"}
_CITIES = ("aachen", "bochum", "bremen", "cologne", "darmstadt", "erfurt", "hamburg", "jena")


def _pil() -> Any:
    try:
        from PIL import Image, ImageDraw
    except ImportError:  # pragma: no cover - Pillow is in the test and image extras
        raise MissingDependencyError("Pillow", "image", "generating synthetic images") from None
    return Image, ImageDraw


def _background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """A smooth colour gradient plus noise, so JPEG and PNG do real work."""
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    c0, c1, c2 = (rng.uniform(0, 255, 3).astype(np.float32) for _ in range(3))
    img = (c0 + (c1 - c0) * x + (c2 - c0) * y).astype(np.int16)
    img += rng.integers(-16, 17, (h, w, 1), dtype=np.int16)  # luminance noise: cheap
    return np.clip(img, 0, 255).astype(np.uint8)


def _polygon(rng: np.random.Generator, w: int, h: int) -> list[float]:
    """A random star-shaped polygon inside the image, as COCO's flat [x0, y0, x1, y1, ...]."""
    cx, cy = rng.uniform(0.15 * w, 0.85 * w), rng.uniform(0.15 * h, 0.85 * h)
    radius = rng.uniform(0.05, 0.25) * min(w, h)
    n = int(rng.integers(4, 9))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = radius * rng.uniform(0.5, 1.0, n)
    xs = np.clip(cx + radii * np.cos(angles), 0, w - 1)
    ys = np.clip(cy + radii * np.sin(angles), 0, h - 1)
    return [round(float(v), 2) for pair in zip(xs, ys, strict=True) for v in pair]


def _polygon_area(flat: list[float]) -> float:
    xs, ys = np.asarray(flat[0::2]), np.asarray(flat[1::2])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2.0)


def _bbox(flat: list[float]) -> list[float]:
    xs, ys = flat[0::2], flat[1::2]
    x0, y0 = min(xs), min(ys)
    return [round(x0, 2), round(y0, 2), round(max(xs) - x0, 2), round(max(ys) - y0, 2)]


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a binary mask: column-major runs, starting with zeros."""
    flat = mask.flatten(order="F").astype(np.uint8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate(([0], changes, [flat.size]))
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        counts = [0, *counts]
    return {"counts": [int(c) for c in counts], "size": [int(mask.shape[0]), int(mask.shape[1])]}


def make_coco(
    root: str | os.PathLike[str],
    num_images: int = 300,
    seed: int = 0,
    size: tuple[int, int] = (640, 480),
    *,
    max_annotations: int = 6,
    split: str = "train2017",
) -> tuple[str, str]:
    """Write a COCO-format dataset under ``root``: JPEGs in ``root/<split>/`` and
    ``root/annotations/instances_<split>.json``.

    ``size`` is the largest ``(width, height)``; images vary in size and content, a
    few are grayscale, about one in ten has no annotation and some have a crowd
    (uncompressed RLE) annotation. Image ids are unique, have gaps and are listed
    out of order; annotations are listed shuffled. Returns ``(images_dir,
    annotations_path)``.
    """
    Image, ImageDraw = _pil()
    rng = np.random.default_rng(seed)
    root = Path(root)
    images_dir = root / split
    ann_dir = root / "annotations"
    images_dir.mkdir(parents=True, exist_ok=True)
    ann_dir.mkdir(parents=True, exist_ok=True)
    max_w, max_h = size

    ids = np.sort(rng.choice(np.arange(1, 8 * num_images + 10), size=num_images, replace=False))
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    ann_ids = iter(
        rng.choice(
            np.arange(1, 50 * num_images * max_annotations + 10),
            replace=False,
            size=num_images * (max_annotations + 1),
        )
    )
    for k, image_id in enumerate(int(i) for i in ids):
        if k % 3 == 1:
            w, h = max_h, max_w  # portrait
        elif k % 3 == 2:
            w, h = int(max_w * rng.uniform(0.5, 1.0)), int(max_h * rng.uniform(0.5, 1.0))
        else:
            w, h = max_w, max_h
        w, h = max(w, 16), max(h, 16)
        img = Image.fromarray(_background(rng, w, h), "RGB")
        draw = ImageDraw.Draw(img)
        n_ann = 0 if k % 10 == 3 else int(rng.integers(1, max_annotations + 1))
        for _ in range(n_ann):
            poly = _polygon(rng, w, h)
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            draw.polygon(list(zip(poly[0::2], poly[1::2], strict=True)), fill=colour)
            cat = COCO_CATEGORIES[int(rng.integers(len(COCO_CATEGORIES)))]
            annotations.append(
                {
                    "segmentation": [poly],
                    "area": round(_polygon_area(poly), 4),
                    "iscrowd": 0,
                    "image_id": image_id,
                    "bbox": _bbox(poly),
                    "category_id": cat["id"],
                    "id": int(next(ann_ids)),
                }
            )
        if n_ann and k % 7 == 2:
            mask = np.zeros((h, w), dtype=bool)
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            x1, y1 = x0 + int(rng.integers(4, w // 2)), y0 + int(rng.integers(4, h // 2))
            mask[y0:y1, x0:x1] = True
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=(200, 200, 40))
            annotations.append(
                {
                    "segmentation": _uncompressed_rle(mask),
                    "area": int(mask.sum()),
                    "iscrowd": 1,
                    "image_id": image_id,
                    "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                    "category_id": 1,
                    "id": int(next(ann_ids)),
                }
            )
        if k % 11 == 5:
            img = img.convert("L")  # COCO has grayscale JPEGs; convert("RGB") must matter
        file_name = f"{image_id:012d}.jpg"
        img.save(images_dir / file_name, "JPEG", quality=int(rng.integers(70, 96)))
        images.append(
            {
                "license": int(rng.integers(1, 4)),
                "file_name": file_name,
                "coco_url": "",
                "height": h,
                "width": w,
                "date_captured": "2013-11-14 16:28:13",
                "flickr_url": "",
                "id": image_id,
            }
        )
    order = rng.permutation(len(images))
    ann_order = rng.permutation(len(annotations))
    doc = {
        "info": {"description": "fastload synthetic COCO", "version": "1.0", "year": 2026},
        "licenses": [{"url": "", "id": i, "name": f"license {i}"} for i in (1, 2, 3)],
        "images": [images[int(i)] for i in order],
        "annotations": [annotations[int(i)] for i in ann_order],
        "categories": [dict(c) for c in COCO_CATEGORIES],
    }
    ann_path = ann_dir / f"instances_{split}.json"
    ann_path.write_text(json.dumps(doc), encoding="utf-8")
    return str(images_dir), str(ann_path)


def make_cityscapes(
    root: str | os.PathLike[str],
    split: str = "train",
    cities: int = 2,
    per_city: int = 3,
    size: tuple[int, int] = (256, 128),
    seed: int = 0,
    *,
    mode: str = "fine",
) -> str:
    """Write a Cityscapes-layout dataset under ``root`` and return ``root``.

    ``leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png`` (RGB) and
    ``gtFine/<split>/<city>/…_gtFine_{labelIds,instanceIds,color}.png`` plus
    ``…_gtFine_polygons.json`` (``gtCoarse`` for ``mode="coarse"``): label ids are
    8-bit, instance ids 16-bit with ``label_id * 1000 + k`` on instance classes,
    colours RGBA. ``size`` is ``(width, height)``.
    """
    Image, ImageDraw = _pil()
    if not 1 <= cities <= len(_CITIES):
        raise ValueError(f"cities must be in 1..{len(_CITIES)}, got {cities}")
    gt = {"fine": "gtFine", "coarse": "gtCoarse"}[mode]
    rng = np.random.default_rng(seed)
    w, h = size
    root_path = Path(root)
    for city in _CITIES[:cities]:
        img_dir = root_path / "leftImg8bit" / split / city
        gt_dir = root_path / gt / split / city
        img_dir.mkdir(parents=True, exist_ok=True)
        gt_dir.mkdir(parents=True, exist_ok=True)
        frames = rng.choice(np.arange(0, 300000), size=per_city, replace=False)
        for frame_no in frames:
            seq = int(rng.integers(0, 200))
            stem = f"{city}_{seq:06d}_{int(frame_no):06d}"
            labels = np.full((h, w), _CS_SKY[0], dtype=np.uint8)
            horizon = int(h * rng.uniform(0.35, 0.55))
            labels[horizon:, :] = _CS_ROAD[0]
            labels[int(horizon * 0.5) : horizon, : int(w * rng.uniform(0.2, 0.6))] = _CS_BUILDING[0]
            instances = labels.astype(np.uint16)
            objects: list[dict[str, Any]] = [
                {"label": "sky", "polygon": [[0, 0], [w - 1, 0], [w - 1, horizon], [0, horizon]]},
                {
                    "label": "road",
                    "polygon": [[0, horizon], [w - 1, horizon], [w - 1, h - 1], [0, h - 1]],
                },
            ]
            counters: dict[int, int] = {}
            for _ in range(int(rng.integers(1, 5))):
                if rng.uniform() < 0.3:
                    label_id, name, _colour = _CS_STUFF[int(rng.integers(len(_CS_STUFF)))]
                    instance = None
                else:
                    label_id, name, _colour = _CS_OBJECTS[int(rng.integers(len(_CS_OBJECTS)))]
                    instance = counters.get(label_id, 0)
                    counters[label_id] = instance + 1
                x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
                x1 = min(w, x0 + int(rng.integers(4, max(5, w // 4))))
                y1 = min(h, y0 + int(rng.integers(4, max(5, h // 3))))
                labels[y0:y1, x0:x1] = label_id
                instances[y0:y1, x0:x1] = (
                    label_id if instance is None else label_id * 1000 + instance
                )
                objects.append(
                    {
                        "label": name,
                        "polygon": [[x0, y0], [x1 - 1, y0], [x1 - 1, y1 - 1], [x0, y1 - 1]],
                    }
                )
            palette = {
                c[0]: c[-1] for c in (_CS_SKY, _CS_ROAD, _CS_BUILDING, *_CS_OBJECTS, *_CS_STUFF)
            }
            colour = np.zeros((h, w, 4), dtype=np.uint8)
            colour[..., 3] = 255
            for label_id, rgb in palette.items():
                colour[labels == label_id, :3] = rgb
            photo = _background(rng, w, h)
            photo[labels == _CS_ROAD[0]] //= 2
            image = Image.fromarray(photo, "RGB")
            ImageDraw.Draw(image).line([(0, horizon), (w - 1, horizon)], fill=(255, 255, 255))
            image.save(img_dir / f"{stem}_leftImg8bit.png")
            Image.fromarray(labels, "L").save(gt_dir / f"{stem}_{gt}_labelIds.png")
            Image.fromarray(instances).save(gt_dir / f"{stem}_{gt}_instanceIds.png")
            Image.fromarray(colour, "RGBA").save(gt_dir / f"{stem}_{gt}_color.png")
            (gt_dir / f"{stem}_{gt}_polygons.json").write_text(
                json.dumps({"imgHeight": h, "imgWidth": w, "objects": objects}, indent=2),
                encoding="utf-8",
            )
    return str(root_path)


def make_folder(
    root: str | os.PathLike[str],
    classes: int = 3,
    per_class: int = 5,
    seed: int = 0,
    size: tuple[int, int] = (64, 48),
) -> str:
    """Write an image-folder dataset (``root/<class>/<image>``) and return ``root``.

    Class names are not created in sorted order; images are JPEG and PNG, one per
    class sits in a nested subdirectory (as ``ImageFolder`` walks recursively), and
    each class folder holds one non-image file that converters must ignore.
    """
    Image, _ = _pil()
    names = ["zebra", "apple", "mango", "kiwi", "banana", "cherry", "lemon", "grape"]
    if not 1 <= classes <= len(names):
        raise ValueError(f"classes must be in 1..{len(names)}, got {classes}")
    rng = np.random.default_rng(seed)
    root_path = Path(root)
    w, h = size
    for name in names[:classes]:
        class_dir = root_path / name
        class_dir.mkdir(parents=True, exist_ok=True)
        (class_dir / "README.txt").write_text(f"images of {name}\n", encoding="utf-8")
        for j in range(per_class):
            target = class_dir / "nested" if j == per_class - 1 and per_class > 1 else class_dir
            target.mkdir(exist_ok=True)
            img = Image.fromarray(_background(rng, w, h), "RGB")
            ext = "png" if j % 2 else "jpg"
            buf = io.BytesIO()
            img.save(buf, "PNG" if ext == "png" else "JPEG", quality=90)
            (target / f"{name}_{int(rng.integers(0, 10**6)):06d}_{j}.{ext}").write_bytes(
                buf.getvalue()
            )
    return str(root_path)


def photo_like(
    width: int = 640, height: int = 480, seed: int = 0, noise: float = 18.0
) -> np.ndarray:
    """An RGB uint8 array with smooth colour waves, a few hard-edged shapes and noise,
    so JPEG at quality 90 is about COCO-sized (~160 KB at 640x480)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, 3)
    planes = [
        128 + 70 * np.sin(xx / 37 + p) * np.cos(yy / 23 - p) + 35 * np.sin((xx + yy) / 11 + 2 * p)
        for p in phase
    ]
    img = np.stack(planes, axis=-1)
    for _ in range(6):  # hard edges, where draft vs full decode differ most
        x0, y0 = rng.integers(0, max(1, width - 40)), rng.integers(0, max(1, height - 40))
        w = rng.integers(min(20, width // 4), max(min(20, width // 4) + 1, width // 3))
        h = rng.integers(min(20, height // 4), max(min(20, height // 4) + 1, height // 3))
        img[y0 : y0 + h, x0 : x0 + w] = rng.uniform(0, 255, 3)
    img += rng.normal(0, noise, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)
