"""Synthetic images for the decode tests, made in memory (nothing committed)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from fastload.convert.synthetic import photo_like

__all__ = ["encode", "photo_like"]


def encode(img: Image.Image | np.ndarray, fmt: str = "JPEG", **params: object) -> bytes:
    """Encode ``img`` (PIL or HWC/HW array) to bytes in ``fmt``."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()
