"""COCO (``instances_*.json`` + an image directory) to fastload shards."""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from fastload._args import keyword_only
from fastload._fs import contained_path
from fastload.convert._common import (
    ConvertReport,
    ErrorPolicy,
    SourceDataError,
    image_field,
    read_image,
    read_json_file,
)
from fastload.convert._driver import WriteSettings, write_samples

__all__ = ["coco", "coco_key", "load_coco_targets"]


def coco_key(image_id: int) -> str:
    """The sample key of a COCO image: its id zero-padded to 12 digits, as COCO names files."""
    return f"{image_id:012d}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_coco_targets(
    doc: Any, path: str, policy: ErrorPolicy
) -> tuple[dict[int, dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Index a parsed COCO annotation document the way ``pycocotools.coco.COCO`` does.

    Returns ``(images by id, annotations by image id)``; each image's annotations
    are exactly what ``coco.loadAnns(coco.getAnnIds(imgIds=id))`` returns: in file
    order, looked up by annotation id (so a repeated annotation id resolves to the
    last one, as in pycocotools). Raises :class:`SourceDataError` naming ``path``
    for a malformed document, a repeated image id, and (unless ``policy`` skips)
    a malformed entry or an annotation whose ``image_id`` is not an image.
    """
    if not isinstance(doc, dict):
        raise SourceDataError("a COCO annotation file must be a JSON object", path)
    raw_images = doc.get("images", [])
    raw_anns = doc.get("annotations", [])
    for name, value in (
        ("images", raw_images),
        ("annotations", raw_anns),
        ("categories", doc.get("categories", [])),
    ):
        if not isinstance(value, list):
            raise SourceDataError(f"'{name}' must be a list, got {type(value).__name__}", path)
    images: dict[int, dict[str, Any]] = {}
    for k, img in enumerate(raw_images):
        if not isinstance(img, dict) or not _is_int(img.get("id")):
            policy.bad(f"images[{k}]", SourceDataError(f"images[{k}] has no integer 'id'", path))
            continue
        if not isinstance(img.get("file_name"), str) or not img["file_name"]:
            policy.bad(
                f"image {img['id']}",
                SourceDataError(f"images[{k}] (id {img['id']}) has no 'file_name'", path),
            )
            continue
        if img["id"] in images:
            raise SourceDataError(f"image id {img['id']} appears more than once", path)
        images[img["id"]] = img
    anns_by_id: dict[Any, dict[str, Any]] = {}
    img_to_anns: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for k, ann in enumerate(raw_anns):
        if not isinstance(ann, dict) or "id" not in ann or "image_id" not in ann:
            policy.bad(
                f"annotations[{k}]",
                SourceDataError(f"annotations[{k}] lacks 'id' or 'image_id'", path),
            )
            continue
        if ann["image_id"] not in images:
            policy.bad(
                f"annotation {ann['id']}",
                SourceDataError(
                    f"annotation {ann['id']} (annotations[{k}]) refers to image id "
                    f"{ann['image_id']!r}, which is not in 'images'",
                    path,
                ),
            )
            continue
        anns_by_id[ann["id"]] = ann
        img_to_anns[ann["image_id"]].append(ann)
    targets = {
        image_id: [anns_by_id[a["id"]] for a in img_to_anns.get(image_id, [])]
        for image_id in images
    }
    return images, targets


@keyword_only(
    "shard_size",
    "storage_options",
    "workers",
    "on_error",
    "progress",
    "verify",
    "overwrite",
    "executor",
)
def coco(
    images: str | os.PathLike[str],
    annotations: str | os.PathLike[str],
    out: str,
    *,
    shard_size: int | str = "256MB",
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    on_error: str = "raise",
    progress: bool = True,
    verify: bool = True,
    overwrite: bool = False,
    executor: str = "local",
) -> ConvertReport:
    """Convert a COCO dataset (a local image directory and its ``instances_*.json``) to
    fastload shards at ``out`` (a path or any URL :class:`fastload.ShardWriter` takes).

    One sample per image, in ascending image id (the order of torchvision's
    ``CocoDetection``): key :func:`coco_key`, the image bytes unchanged under their
    extension (``jpg``), and ``json`` = ``{"image": <image entry>, "annotations":
    [<entries as pycocotools' loadAnns(getAnnIds(imgIds=id)) returns them>], "order":
    {"image": k, "annotations": [k, ...]}}`` (where the image and its annotations stand
    in the file: ``CocoDetection.coco`` lists them in the file's order).
    Categories, info, licenses and the image ids go into the manifest's ``source``.
    Images are read and (with ``verify``) fully decoded on ``workers`` threads.

    An output that already holds a dataset is refused
    (:class:`~fastload.errors.OutputExistsError`) unless ``overwrite``; a run that fails
    or is interrupted leaves the output as it was (see :class:`~fastload.ShardWriter`).

    Returns a :class:`ConvertReport`. Raises :class:`SourceDataError` naming the file
    for malformed JSON, missing or corrupt images and annotations of unknown
    images, unless ``on_error="skip"``, which leaves them out and lists them in the
    report. No manifest is written when the conversion fails.

    ``executor="ray"`` reads and writes on Ray tasks (see :mod:`fastload.convert._ray`):
    the same samples, byte for byte, in the same order, in other shards.
    """
    settings = WriteSettings.make(
        out, shard_size, storage_options, workers, progress, overwrite, executor
    )
    policy = ErrorPolicy(on_error)
    ann_path = os.fspath(annotations)
    images_dir = os.fspath(images)
    if not os.path.isdir(images_dir):
        raise SourceDataError("image directory does not exist", images_dir)
    doc = read_json_file(ann_path, "COCO annotation file")
    by_id, targets = load_coco_targets(doc, ann_path, policy)

    # Missing files are found before anything is written, so a typo fails fast.
    todo: list[tuple[int, str]] = []
    for image_id in sorted(by_id):
        file_name = by_id[image_id]["file_name"]
        contained = contained_path(images_dir, file_name)
        if contained is None:  # "../x" or "/etc/x" would copy a file from elsewhere
            policy.bad(
                f"image {image_id}",
                SourceDataError(
                    f"images[id {image_id}].file_name {file_name!r} leaves the image "
                    f"directory {images_dir}",
                    ann_path,
                ),
            )
            continue
        path = contained
        if not os.path.isfile(path):
            policy.bad(
                f"image {image_id}",
                SourceDataError(f"image file is missing (image id {image_id} in {ann_path})", path),
            )
            continue
        todo.append((image_id, path))

    source = {
        "kind": "coco",
        "annotations": os.path.basename(ann_path),
        "info": doc.get("info", {}),
        "licenses": doc.get("licenses", []),
        "categories": doc.get("categories", []),
    }

    # where each image and annotation stands in the file, so that CocoDetection.coco
    # lists them in the file's order, as pycocotools does (getImgIds(), getAnnIds())
    image_pos = {image_id: k for k, image_id in enumerate(by_id)}
    ann_pos: dict[Any, int] = {}
    for k, ann in enumerate(doc.get("annotations", [])):
        with contextlib.suppress(TypeError, AttributeError):  # skipped above: unindexed
            ann_pos.setdefault(ann.get("id"), k)  # first place, as pycocotools' dict keeps

    def sample(image_id: int, path: str, data: bytes, fmt: str) -> dict[str, Any]:
        order = {
            "image": image_pos[image_id],
            "annotations": [ann_pos[a["id"]] for a in targets[image_id]],
        }
        return {
            "__key__": coco_key(image_id),
            image_field(path, fmt): data,
            "json": {"image": by_id[image_id], "annotations": targets[image_id], "order": order},
        }

    def finish_source(src: dict[str, Any], written: list[int]) -> None:
        src["image_ids"] = [todo[k][0] for k in written]

    return write_samples(
        todo,
        lambda t: read_image(t[1], verify),
        lambda _n, t, r: sample(t[0], t[1], *r),
        lambda t: f"image {t[0]}",
        settings=settings,
        policy=policy,
        source=source,
        finish_source=finish_source,
        desc="convert coco",
    )
