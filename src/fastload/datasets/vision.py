"""The base classes of the torchvision drop-ins: torchvision's own when it imports.

``fastload.CocoDetection``, ``fastload.Cityscapes`` and ``fastload.ImageFolder``
subclass ``torchvision.datasets.CocoDetection``, ``Cityscapes`` and ``ImageFolder``
when torchvision imports, so ``wrap_dataset_for_transforms_v2``, ``isinstance``
checks (the detection reference's ``get_coco_api_from_dataset``), ``__add__`` and
the ``StandardTransform`` of ``.transforms`` behave as for torchvision's datasets.
torchvision's constructors (which list local files) are never called: the drop-ins
set the attributes torchvision's hooks read themselves (:func:`init_vision`).

Where torchvision is absent, or fails to import (a wheel built for another torch
raises ``RuntimeError: operator torchvision::nms does not exist``), the same names
are plain stand-ins and the drop-ins work as plain datasets. Importing this module
imports torchvision (seconds); ``import fastload`` does not import this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from fastload.errors import ConfigError, MissingDependencyError

__all__ = [
    "TORCHVISION",
    "CityscapesBase",
    "CocoBase",
    "FolderBase",
    "PairTransform",
    "PlainVisionDataset",
    "StandardTransform",
    "check_transforms",
    "combine_transforms",
    "init_vision",
]


def _torchvision_datasets() -> Any:
    """``torchvision.datasets``, or None where torchvision does not import."""
    try:
        import torchvision.datasets
        import torchvision.datasets.vision
    except Exception:  # absent, or built for another torch (RuntimeError, OSError)
        return None
    return torchvision.datasets


class PairTransform:
    """torchvision's ``StandardTransform`` where torchvision does not import: apply
    ``transform`` to the image and ``target_transform`` to the target (either may be
    ``None``)."""

    def __init__(
        self, transform: Callable[..., Any] | None, target_transform: Callable[..., Any] | None
    ) -> None:
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, image: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __repr__(self) -> str:
        return (
            f"PairTransform(transform={self.transform!r}, "
            f"target_transform={self.target_transform!r})"
        )


class PlainVisionDataset:
    """The drop-ins' base where torchvision does not import: ``ds + other`` is a
    ``torch.utils.data.ConcatDataset`` as for torch's datasets (needs torch)."""

    def __add__(self, other: Any) -> Any:
        try:
            from torch.utils.data import ConcatDataset
        except ImportError:
            raise MissingDependencyError("torch", "torch", "adding datasets") from None
        return ConcatDataset([cast(Any, self), other])


_TVD = _torchvision_datasets()
#: Whether torchvision imported: the drop-ins are then torchvision's subclasses.
TORCHVISION: bool = _TVD is not None

# Typed Any: torchvision's classes, or the plain stand-ins.
StandardTransform: Any = _TVD.vision.StandardTransform if _TVD is not None else PairTransform
CocoBase: Any = _TVD.CocoDetection if _TVD is not None else PlainVisionDataset
CityscapesBase: Any = _TVD.Cityscapes if _TVD is not None else PlainVisionDataset
FolderBase: Any = _TVD.ImageFolder if _TVD is not None else PlainVisionDataset


def check_transforms(owner: str, **given: Any) -> None:
    """Raise ``TypeError`` unless each of ``given`` is callable or None.

    A path where a transform belongs is torchvision's call shape (``CocoDetection(root,
    annFile)``), which cannot mean what it says here: the message says so.
    """
    for name, value in given.items():
        if value is None or callable(value):
            continue
        hint = ""
        if isinstance(value, (str, bytes, os.PathLike)):
            hint = (
                "; a path here is torchvision's call shape (CocoDetection(root, annFile)), "
                f"which cannot mean that here: fastload.{owner}(url) reads images and "
                "targets from the dataset `fastload convert` wrote at url; pass transforms "
                "by keyword"
            )
        raise TypeError(
            f"fastload.{owner}: {name} must be a callable or None, got "
            f"{type(value).__name__} {value!r}{hint}"
        )


def combine_transforms(
    transforms: Callable[..., Any] | None,
    transform: Callable[..., Any] | None,
    target_transform: Callable[..., Any] | None,
) -> Callable[[Any, Any], tuple[Any, Any]] | None:
    """The joint transform, as torchvision's ``VisionDataset`` builds it (a
    ``StandardTransform`` of the separate ones).

    Raises :class:`ConfigError` (a ``ValueError``) if ``transforms`` is given together
    with ``transform`` or ``target_transform``.
    """
    separate = transform is not None or target_transform is not None
    if transforms is not None and separate:
        raise ConfigError("Only transforms or transform/target_transform can be passed as argument")
    if separate:
        return StandardTransform(transform, target_transform)
    return transforms


def init_vision(
    ds: Any,
    owner: str,
    root: str,
    transforms: Callable[..., Any] | None,
    transform: Callable[..., Any] | None,
    target_transform: Callable[..., Any] | None,
) -> None:
    """Set what ``VisionDataset.__init__`` sets on ``ds`` (``root``, ``transform``,
    ``target_transform``, ``transforms``), after :func:`check_transforms`."""
    check_transforms(
        owner, transform=transform, target_transform=target_transform, transforms=transforms
    )
    ds.transforms = combine_transforms(transforms, transform, target_transform)
    ds.transform = transform
    ds.target_transform = target_transform
    ds.root = root
