"""Lazy imports of the optional packages the decode layer uses."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from fastload.config import env
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


#: Environment variable ``FASTLOAD_CROP_DECODER``: ``pillow`` sends every JPEG decode
#: (whole images too, not only crops) through Pillow instead of the native decoder.
NATIVE_DECODER_ENV = "FASTLOAD_CROP_DECODER"


def native_jpeg() -> Any | None:
    """Return ``fastload._native`` where it was built with libjpeg-turbo and
    ``$FASTLOAD_CROP_DECODER`` is not ``pillow``, else ``None`` (decode with Pillow)."""
    if env(NATIVE_DECODER_ENV) == "pillow":
        return None
    try:
        from fastload import _native
    except ImportError:  # pragma: no cover - the extension is built in the test venv
        return None
    return _native if getattr(_native, "HAVE_JPEG", False) else None
