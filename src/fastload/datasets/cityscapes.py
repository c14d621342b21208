"""``fastload.Cityscapes``: torchvision's ``Cityscapes`` over fastload shards.

Also the Cityscapes tables the converter uses: the 35 label classes, the valid
splits and modes, and the sample fields of each target type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from fastload.datasets.coco import as_bytes, combine_transforms, open_samples
from fastload.decode.image import open_image
from fastload.errors import ConfigError

__all__ = [
    "CITYSCAPES_CLASSES",
    "CITYSCAPES_MODES",
    "CITYSCAPES_SPLITS",
    "IMAGE_FIELD",
    "TARGET_SUFFIXES",
    "TARGET_TYPES",
    "Cityscapes",
    "CityscapesClass",
    "target_fields",
    "validate_split_mode",
]


class CityscapesClass(NamedTuple):
    """One Cityscapes label (the fields of torchvision's ``Cityscapes.CityscapesClass``)."""

    name: str
    id: int
    train_id: int
    category: str
    category_id: int
    has_instances: bool
    ignore_in_eval: bool
    color: tuple[int, int, int]


# Data from cityscapesScripts' labels.py, as torchvision lists it.
CITYSCAPES_CLASSES: tuple[CityscapesClass, ...] = tuple(
    CityscapesClass(*row)
    for row in (
        ("unlabeled", 0, 255, "void", 0, False, True, (0, 0, 0)),
        ("ego vehicle", 1, 255, "void", 0, False, True, (0, 0, 0)),
        ("rectification border", 2, 255, "void", 0, False, True, (0, 0, 0)),
        ("out of roi", 3, 255, "void", 0, False, True, (0, 0, 0)),
        ("static", 4, 255, "void", 0, False, True, (0, 0, 0)),
        ("dynamic", 5, 255, "void", 0, False, True, (111, 74, 0)),
        ("ground", 6, 255, "void", 0, False, True, (81, 0, 81)),
        ("road", 7, 0, "flat", 1, False, False, (128, 64, 128)),
        ("sidewalk", 8, 1, "flat", 1, False, False, (244, 35, 232)),
        ("parking", 9, 255, "flat", 1, False, True, (250, 170, 160)),
        ("rail track", 10, 255, "flat", 1, False, True, (230, 150, 140)),
        ("building", 11, 2, "construction", 2, False, False, (70, 70, 70)),
        ("wall", 12, 3, "construction", 2, False, False, (102, 102, 156)),
        ("fence", 13, 4, "construction", 2, False, False, (190, 153, 153)),
        ("guard rail", 14, 255, "construction", 2, False, True, (180, 165, 180)),
        ("bridge", 15, 255, "construction", 2, False, True, (150, 100, 100)),
        ("tunnel", 16, 255, "construction", 2, False, True, (150, 120, 90)),
        ("pole", 17, 5, "object", 3, False, False, (153, 153, 153)),
        ("polegroup", 18, 255, "object", 3, False, True, (153, 153, 153)),
        ("traffic light", 19, 6, "object", 3, False, False, (250, 170, 30)),
        ("traffic sign", 20, 7, "object", 3, False, False, (220, 220, 0)),
        ("vegetation", 21, 8, "nature", 4, False, False, (107, 142, 35)),
        ("terrain", 22, 9, "nature", 4, False, False, (152, 251, 152)),
        ("sky", 23, 10, "sky", 5, False, False, (70, 130, 180)),
        ("person", 24, 11, "human", 6, True, False, (220, 20, 60)),
        ("rider", 25, 12, "human", 6, True, False, (255, 0, 0)),
        ("car", 26, 13, "vehicle", 7, True, False, (0, 0, 142)),
        ("truck", 27, 14, "vehicle", 7, True, False, (0, 0, 70)),
        ("bus", 28, 15, "vehicle", 7, True, False, (0, 60, 100)),
        ("caravan", 29, 255, "vehicle", 7, True, True, (0, 0, 90)),
        ("trailer", 30, 255, "vehicle", 7, True, True, (0, 0, 110)),
        ("train", 31, 16, "vehicle", 7, True, False, (0, 80, 100)),
        ("motorcycle", 32, 17, "vehicle", 7, True, False, (0, 0, 230)),
        ("bicycle", 33, 18, "vehicle", 7, True, False, (119, 11, 32)),
        ("license plate", -1, -1, "vehicle", 7, False, True, (0, 0, 142)),
    )
)

#: mode -> the ground-truth directory (and file-name part) it uses.
CITYSCAPES_MODES: dict[str, str] = {"fine": "gtFine", "coarse": "gtCoarse"}
CITYSCAPES_SPLITS: dict[str, tuple[str, ...]] = {
    "fine": ("train", "test", "val"),
    "coarse": ("train", "train_extra", "val"),
}
TARGET_TYPES: tuple[str, ...] = ("instance", "semantic", "polygon", "color")
#: target_type -> file suffix after ``<city>_<seq>_<frame>_<gtFine|gtCoarse>_``.
TARGET_SUFFIXES: dict[str, str] = {
    "instance": "instanceIds.png",
    "semantic": "labelIds.png",
    "color": "color.png",
    "polygon": "polygons.json",
}
#: The sample field of the camera image.
IMAGE_FIELD = "leftImg8bit.png"


def _one_of(value: object, arg: str, valid: Sequence[str], msg: str | None = None) -> str:
    """torchvision's ``verify_str_arg``, raising :class:`ConfigError` (a ``ValueError``)."""
    if not isinstance(value, str):
        raise ConfigError(f"Expected type str for argument {arg}, but got type {type(value)}.")
    if value not in valid:
        listed = ", ".join(f"'{v}'" for v in valid)
        raise ConfigError(
            msg or f"Unknown value '{value}' for argument {arg}. Valid values are {{{listed}}}."
        )
    return value


def validate_split_mode(split: str, mode: str) -> None:
    """Check ``split`` and ``mode`` as torchvision's ``Cityscapes`` does.

    Raises :class:`ConfigError` (a ``ValueError``) listing the valid values.
    """
    _one_of(mode, "mode", tuple(CITYSCAPES_MODES))
    valid = CITYSCAPES_SPLITS[mode]
    listed = ", ".join(f"'{v}'" for v in valid)
    _one_of(
        split,
        "split",
        valid,
        f"Unknown value '{split}' for argument split if mode is '{mode}'. "
        f"Valid values are {{{listed}}}.",
    )


def target_fields(mode: str) -> dict[str, str]:
    """target_type -> sample field for ``mode``, e.g. ``"semantic" -> "gtFine_labelIds.png"``."""
    gt = CITYSCAPES_MODES[mode]
    return {t: f"{gt}_{suffix}" for t, suffix in TARGET_SUFFIXES.items()}


class Cityscapes:
    """Cityscapes samples from a dataset written by ``fastload.convert.cityscapes``.

    ``ds[i]`` is ``(image, target)`` as torchvision's ``Cityscapes`` gives it: the
    camera image ``.convert("RGB")``, and for each ``target_type`` the label-id
    (``"semantic"``), instance-id (``"instance"``) or colour (``"color"``) PIL image
    as stored, or the polygon dict (``"polygon"``); a tuple when several types are
    asked for. Samples are in the converter's canonical order (cities, then file
    names, sorted). ``split`` and ``mode`` must be those the dataset was converted
    with; ``cache_dir``, ``cache_limit``, ``storage_options`` go to
    :class:`fastload.ShardedDataset`.

    Raises :class:`ConfigError` (a ``ValueError``) for a bad split, mode or target
    type, bad transforms, or a dataset that is not that Cityscapes split.
    """

    classes: ClassVar[list[CityscapesClass]] = list(CITYSCAPES_CLASSES)

    def __init__(
        self,
        url: str,
        split: str = "train",
        mode: str = "fine",
        target_type: str | Sequence[str] = "instance",
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        transforms: Callable[..., Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.transforms = combine_transforms(transforms, transform, target_transform)
        self.transform = transform
        self.target_transform = target_transform
        validate_split_mode(split, mode)
        raw = list(target_type) if isinstance(target_type, (list, tuple)) else [target_type]
        types = [_one_of(t, "target_type", TARGET_TYPES) for t in raw]
        if not types:
            raise ConfigError("target_type must name at least one target type")
        self.url = str(url)
        self.split = split
        self.mode = CITYSCAPES_MODES[mode]  # torchvision keeps "gtFine" / "gtCoarse" here
        self.target_type: list[str] = types
        self.data = open_samples(
            self.url,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            cache_limit=cache_limit,
            storage_options=storage_options,
        )
        source = self.data.manifest.source
        if source.get("kind") != "cityscapes":
            raise ConfigError(
                f"{self.url}: not a Cityscapes dataset (manifest source kind is "
                f"{source.get('kind')!r}); write one with `fastload convert cityscapes`"
            )
        if (source.get("split"), source.get("mode")) != (split, mode):
            raise ConfigError(
                f"{self.url} holds Cityscapes split {source.get('split')!r} mode "
                f"{source.get('mode')!r}, not split {split!r} mode {mode!r}; each split is "
                "converted to its own URL"
            )
        fields = target_fields(mode)
        self._fields = [fields[t] for t in types]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample = self.data[index]
        key = sample.get("__key__")
        image = open_image(as_bytes(sample[IMAGE_FIELD]), name=key)[0].convert("RGB")
        targets: list[Any] = []
        for t, name in zip(self.target_type, self._fields, strict=True):
            data = as_bytes(sample[name])
            targets.append(json.loads(data) if t == "polygon" else open_image(data, name=key)[0])
        target: Any = tuple(targets) if len(targets) > 1 else targets[0]
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target

    def __repr__(self) -> str:
        return (
            f"Cityscapes({self.url!r}, split={self.split!r}, mode={self.mode!r}, "
            f"target_type={self.target_type!r}, samples={len(self)})"
        )
