"""An image folder (``root/<class>/**/<image>``, as torchvision's ``ImageFolder``) to shards."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from fastload._args import keyword_only
from fastload.convert._common import (
    ConvertReport,
    ErrorPolicy,
    SourceDataError,
    image_field,
    read_image,
)
from fastload.convert._driver import WriteSettings, write_samples

__all__ = ["IMG_EXTENSIONS", "find_images", "folder"]

#: The extensions torchvision's ``ImageFolder`` accepts (compared case-insensitively).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_images(
    root: str, extensions: Sequence[str] = IMG_EXTENSIONS
) -> tuple[list[str], list[tuple[str, int]]]:
    """List an image folder the way ``ImageFolder`` does.

    Returns ``(classes, [(path, class_index), ...])``: classes are the sorted names
    of ``root``'s subdirectories; each class's images are found by a sorted,
    recursive walk (symlinks followed), keeping files with one of ``extensions``.
    Raises :class:`SourceDataError` if ``root`` is missing or has no class folder.
    """
    if not os.path.isdir(root):
        raise SourceDataError("image folder does not exist", root)
    with os.scandir(root) as it:
        classes = sorted(e.name for e in it if e.is_dir())
    if not classes:
        raise SourceDataError("no class folders found (expected root/<class>/<image>)", root)
    exts = tuple(e.lower() for e in extensions)
    samples: list[tuple[str, int]] = []
    for index, name in enumerate(classes):
        for dirpath, _dirs, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            samples.extend(
                (os.path.join(dirpath, f), index) for f in sorted(files) if f.lower().endswith(exts)
            )
    return classes, samples


@keyword_only(
    "shard_size",
    "storage_options",
    "workers",
    "on_error",
    "progress",
    "verify",
    "extensions",
    "overwrite",
    "executor",
)
def folder(
    root: str | os.PathLike[str],
    out: str,
    *,
    shard_size: int | str = "256MB",
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    on_error: str = "raise",
    progress: bool = True,
    verify: bool = True,
    extensions: Sequence[str] = IMG_EXTENSIONS,
    overwrite: bool = False,
    executor: str = "local",
) -> ConvertReport:
    """Convert an image folder (one subdirectory per class) to fastload shards at ``out``.

    Samples follow ``ImageFolder``'s order (see :func:`find_images`); sample ``i``
    has key ``i`` zero-padded to 8 digits, the image bytes unchanged under their
    extension (``jpg``, ``png``…) and ``cls``, the class index in the sorted class
    names, which the manifest's ``source["classes"]`` lists.

    An output that already holds a dataset is refused
    (:class:`~fastload.errors.OutputExistsError`) unless ``overwrite``; a run that fails
    or is interrupted leaves the output as it was (see :class:`~fastload.ShardWriter`).

    Returns a :class:`ConvertReport`. Raises :class:`SourceDataError` naming the
    file for an unreadable or corrupt image, unless ``on_error="skip"``.

    ``executor="ray"`` reads and writes on Ray tasks (see :mod:`fastload.convert._ray`).
    With ``on_error="skip"`` its keys number the inputs (so a skipped image leaves a
    gap), not the written samples as the local converter's do.
    """
    settings = WriteSettings.make(
        out, shard_size, storage_options, workers, progress, overwrite, executor
    )
    policy = ErrorPolicy(on_error)
    root = os.fspath(root)
    classes, todo = find_images(root, extensions)
    source = {
        "kind": "folder",
        "classes": classes,
        "extensions": [e.lower() for e in extensions],
        "order": "classes sorted; images by a sorted recursive walk of each class folder",
    }

    return write_samples(
        todo,
        lambda t: read_image(t[0], verify),
        lambda n, t, r: {"__key__": f"{n:08d}", image_field(t[0], r[1]): r[0], "cls": t[1]},
        lambda t: os.path.relpath(t[0], root),
        settings=settings,
        policy=policy,
        source=source,
        desc="convert folder",
    )
