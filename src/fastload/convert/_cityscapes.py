"""Cityscapes (``leftImg8bit/`` + ``gtFine/`` or ``gtCoarse/``) to fastload shards."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastload._args import keyword_only
from fastload.convert._common import (
    ConvertReport,
    ErrorPolicy,
    SourceDataError,
    image_format,
    parse_json,
    read_source_file,
)
from fastload.convert._driver import WriteSettings, write_samples
from fastload.decode.cityscapes import (
    CITYSCAPES_CLASSES,
    CITYSCAPES_MODES,
    IMAGE_FIELD,
    TARGET_SUFFIXES,
    target_fields,
    validate_split_mode,
)

IMAGE_SUFFIX = "_leftImg8bit.png"

__all__ = ["cityscapes"]


def _list_dir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        raise SourceDataError(f"cannot list directory ({exc.strerror or exc})", path) from None


def _read_sample(paths: dict[str, str], verify: bool) -> dict[str, bytes]:
    """Read one sample's files, checking the PNGs decode and the JSON parses."""
    out: dict[str, bytes] = {}
    for name, path in paths.items():
        data = read_source_file(path)
        if name.endswith(".json"):
            parse_json(data, path, "polygon file")
        else:
            image_format(data, path, verify)
        out[name] = data
    return out


@keyword_only(
    "split",
    "mode",
    "shard_size",
    "storage_options",
    "workers",
    "on_error",
    "progress",
    "verify",
    "overwrite",
    "executor",
)
def cityscapes(
    root: str | os.PathLike[str],
    out: str,
    *,
    split: str = "train",
    mode: str = "fine",
    shard_size: int | str = "256MB",
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    on_error: str = "raise",
    progress: bool = True,
    verify: bool = True,
    overwrite: bool = False,
    executor: str = "local",
) -> ConvertReport:
    """Convert one split of Cityscapes at ``root`` to fastload shards at ``out``.

    One sample per camera image, key ``<city>_<seq>_<frame>``, fields
    ``leftImg8bit.png`` and ``gtFine_instanceIds.png``, ``gtFine_labelIds.png``,
    ``gtFine_color.png``, ``gtFine_polygons.json`` (``gtCoarse_…`` for
    ``mode="coarse"``), all bytes unchanged. The order is canonical: cities sorted
    by name, then files sorted by name (torchvision walks ``os.listdir`` unsorted,
    so its order depends on the file system; sorted is the reproducible choice).
    The manifest's ``source`` holds split, mode, cities and the 35 label classes.

    An output that already holds a dataset is refused
    (:class:`~fastload.errors.OutputExistsError`) unless ``overwrite``; a run that fails
    or is interrupted leaves the output as it was (see :class:`~fastload.ShardWriter`).

    Returns a :class:`ConvertReport`. Raises :class:`ConfigError` for a bad split or
    mode, and :class:`SourceDataError` naming the file for a missing directory, a
    missing target, an undecodable PNG or malformed polygon JSON, unless
    ``on_error="skip"``, which leaves such samples out and lists them.

    ``executor="ray"`` reads and writes on Ray tasks (see :mod:`fastload.convert._ray`).
    """
    validate_split_mode(split, mode)
    settings = WriteSettings.make(
        out, shard_size, storage_options, workers, progress, overwrite, executor
    )
    policy = ErrorPolicy(on_error)
    root = os.fspath(root)
    gt = CITYSCAPES_MODES[mode]
    images_dir = os.path.join(root, "leftImg8bit", split)
    targets_dir = os.path.join(root, gt, split)
    for d in (images_dir, targets_dir):
        if not os.path.isdir(d):
            raise SourceDataError(
                f"directory does not exist: a Cityscapes root holds leftImg8bit/{split} "
                f"and {gt}/{split}",
                d,
            )
    fields = target_fields(mode)
    cities = [c for c in _list_dir(images_dir) if os.path.isdir(os.path.join(images_dir, c))]
    todo: list[tuple[str, dict[str, str]]] = []
    for city in cities:
        for file_name in _list_dir(os.path.join(images_dir, city)):
            path = os.path.join(images_dir, city, file_name)
            if not file_name.endswith(IMAGE_SUFFIX):
                policy.bad(
                    file_name,
                    SourceDataError(
                        f"unexpected file: Cityscapes images are named "
                        f"<city>_<seq>_<frame>{IMAGE_SUFFIX}",
                        path,
                    ),
                )
                continue
            stem = file_name.split("_leftImg8bit")[0]  # torchvision's rule
            if not stem or "." in stem:
                policy.bad(
                    file_name,
                    SourceDataError(
                        "file name does not give a valid sample key (no dots allowed)", path
                    ),
                )
                continue
            paths = {IMAGE_FIELD: path}
            for t, field_name in fields.items():
                paths[field_name] = os.path.join(
                    targets_dir, city, f"{stem}_{gt}_{TARGET_SUFFIXES[t]}"
                )
            missing = [p for p in paths.values() if not os.path.isfile(p)]
            if missing:
                policy.bad(stem, SourceDataError(f"target file of {stem} is missing", missing[0]))
                continue
            todo.append((stem, paths))

    source = {
        "kind": "cityscapes",
        "split": split,
        "mode": mode,
        "order": "cities sorted by name, then file names sorted",
        "cities": cities,
        "image_field": IMAGE_FIELD,
        "target_fields": fields,
        "classes": [c._asdict() for c in CITYSCAPES_CLASSES],
    }

    return write_samples(
        todo,
        lambda t: _read_sample(t[1], verify),
        lambda _n, t, r: {"__key__": t[0], **r},
        lambda t: t[0],
        settings=settings,
        policy=policy,
        source=source,
        desc=f"convert cityscapes {split}",
    )
