"""Cityscapes tables: the 35 label classes (cityscapesScripts' ``labels.py``, as
torchvision lists them), the valid splits and modes, the sample fields of each
target type, and torchvision's argument checks.

Pure data and checks (no I/O, no dependencies beyond the standard library), here
so that both :mod:`fastload.convert` (which writes Cityscapes shards) and
:mod:`fastload.datasets.cityscapes` (which reads them) import it downward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fastload.errors import ConfigError

__all__ = [
    "CITYSCAPES_CLASSES",
    "CITYSCAPES_MODES",
    "CITYSCAPES_SPLITS",
    "IMAGE_FIELD",
    "TARGET_SUFFIXES",
    "TARGET_TYPES",
    "CityscapesClass",
    "one_of",
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


def one_of(value: object, arg: str, valid: Sequence[str], msg: str | None = None) -> str:
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
    one_of(mode, "mode", tuple(CITYSCAPES_MODES))
    valid = CITYSCAPES_SPLITS[mode]
    listed = ", ".join(f"'{v}'" for v in valid)
    one_of(
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
