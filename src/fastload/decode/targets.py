"""COCO detection targets: boxes, labels, masks, iscrowd, area, image_id.

The input is an image's annotations exactly as ``pycocotools.COCO.loadAnns`` returns
them (what torchvision's ``CocoDetection`` gives as the target); the output is the
dict torchvision's detection models take, as numpy arrays or torch tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastload.decode._deps import pil_image, torch_module
from fastload.decode.masks import segmentation_to_mask
from fastload.errors import ConfigError, DecodeError

__all__ = ["BOX_FORMATS", "category_map", "coco_targets"]

BOX_FORMATS = ("xyxy", "xywh")


def category_map(categories: Sequence[Mapping[str, Any]], start: int = 1) -> dict[int, int]:
    """Map COCO category ids (sparse, e.g. 1..90) to contiguous labels ``start, start+1, ...``
    in ascending id order (``start=1`` keeps 0 for the background class).

    ``categories`` is the ``categories`` list of a COCO annotation file (dicts with
    ``id``). Raises :class:`ConfigError` on a duplicate or missing id.
    """
    try:
        ids = sorted(int(c["id"]) for c in categories)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"categories need an integer 'id' each: {e}") from e
    if len(set(ids)) != len(ids):
        raise ConfigError("categories have duplicate ids")
    return {cid: start + i for i, cid in enumerate(ids)}


def _resize_mask(mask: np.ndarray, width: int, height: int) -> np.ndarray:
    image = pil_image()
    resized = image.fromarray(mask).resize((width, height), image.Resampling.NEAREST)
    return np.asarray(resized, dtype=np.uint8)


def coco_targets(
    annotations: Sequence[Mapping[str, Any]],
    *,
    height: int,
    width: int,
    image_id: int | None = None,
    out_size: tuple[int, int] | None = None,
    box_format: str = "xyxy",
    label_map: Mapping[int, int] | None = None,
    masks: bool = False,
    mask_backend: str = "auto",
    as_tensor: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    """Build detection targets from one image's COCO annotations.

    ``height``/``width`` are the original image's; ``out_size=(height, width)`` is the
    size the image was resized to (boxes and masks are scaled to it). Returns a dict:
    ``boxes`` float32 ``(N, 4)`` (``xyxy`` from COCO's ``xywh``, or kept ``xywh``),
    ``labels`` int64 (category ids, through ``label_map`` if given), ``iscrowd`` int64,
    ``area`` float32 (scaled with the boxes), ``image_id`` (int; from ``image_id`` or
    the annotations, -1 if neither), and with ``masks=True`` ``masks`` uint8
    ``(N, H, W)`` from polygons/RLE. Arrays are torch tensors when ``as_tensor``.

    Raises :class:`DecodeError` naming ``name`` for a malformed annotation or a category
    missing from ``label_map``; :class:`ConfigError` for bad arguments.
    """
    if box_format not in BOX_FORMATS:
        raise ConfigError(f"box_format must be one of {BOX_FORMATS}, got {box_format!r}")
    where = f" of {name!r}" if name else ""
    n = len(annotations)
    boxes = np.zeros((n, 4), dtype=np.float32)
    labels = np.zeros(n, dtype=np.int64)
    iscrowd = np.zeros(n, dtype=np.int64)
    area = np.zeros(n, dtype=np.float32)
    for i, ann in enumerate(annotations):
        try:
            boxes[i] = [float(v) for v in ann["bbox"]]
            category = int(ann["category_id"])
            iscrowd[i] = int(ann.get("iscrowd", 0))
            area[i] = float(ann.get("area", boxes[i, 2] * boxes[i, 3]))
        except (KeyError, TypeError, ValueError) as e:
            raise DecodeError(
                f"annotation {i}{where} is malformed (needs bbox [x, y, w, h] and "
                f"category_id): {type(e).__name__}: {e}"
            ) from e
        if label_map is not None:
            if category not in label_map:
                raise DecodeError(f"annotation {i}{where}: category_id {category} not in label_map")
            category = label_map[category]
        labels[i] = category
    if image_id is None:
        image_id = int(annotations[0]["image_id"]) if n and "image_id" in annotations[0] else -1

    out_h, out_w = (height, width) if out_size is None else out_size
    sx, sy = out_w / width, out_h / height
    if (sx, sy) != (1.0, 1.0):
        boxes *= np.array([sx, sy, sx, sy], dtype=np.float32)
        area *= np.float32(sx * sy)
    if box_format == "xyxy":
        boxes[:, 2:] += boxes[:, :2]

    result: dict[str, Any] = {
        "boxes": boxes,
        "labels": labels,
        "iscrowd": iscrowd,
        "area": area,
        "image_id": int(image_id),
    }
    if masks:
        stack = np.zeros((n, out_h, out_w), dtype=np.uint8)
        for i, ann in enumerate(annotations):
            try:
                mask = segmentation_to_mask(
                    ann.get("segmentation", []), height, width, backend=mask_backend
                )
            except DecodeError as e:
                raise DecodeError(f"annotation {i}{where}: {e}") from e
            stack[i] = (
                mask if (out_h, out_w) == (height, width) else _resize_mask(mask, out_w, out_h)
            )
        result["masks"] = stack
    if as_tensor:
        torch = torch_module()
        for key, value in result.items():
            if isinstance(value, np.ndarray):
                result[key] = torch.from_numpy(value)
    return result
