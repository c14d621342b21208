"""Lazy imports of the optional packages the decode layer uses."""

from __future__ import annotations

from types import ModuleType

from fastload.errors import MissingDependencyError


def pil_image() -> ModuleType:
    """Return ``PIL.Image``; raises :class:`MissingDependencyError` (extra ``image``)."""
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow is installed in the test venv
        raise MissingDependencyError("Pillow", "image", "image decoding") from e
    return Image


def torch_module() -> ModuleType:
    """Return ``torch``; raises :class:`MissingDependencyError` (extra ``torch``)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is installed in the test venv
        raise MissingDependencyError("torch", "torch", "tensor outputs") from e
    return torch


def pycocotools_mask() -> ModuleType | None:
    """Return ``pycocotools.mask`` if it is installed, else ``None`` (numpy fallback)."""
    try:
        from pycocotools import mask
    except ImportError:
        return None
    return mask
