"""Synthetic images for the decode tests, made in memory (nothing committed)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def photo_like(
    width: int = 640, height: int = 480, seed: int = 0, noise: float = 18.0
) -> np.ndarray:
    """An RGB uint8 array with smooth colour waves, a few hard-edged shapes and noise,
    so JPEG at quality 90 is about COCO-sized (~160 KB at 640x480)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, 3)
    planes = [
        128 + 70 * np.sin(xx / 37 + p) * np.cos(yy / 23 - p) + 35 * np.sin((xx + yy) / 11 + 2 * p)
        for p in phase
    ]
    img = np.stack(planes, axis=-1)
    for _ in range(6):  # hard edges, where draft vs full decode differ most
        x0, y0 = rng.integers(0, max(1, width - 40)), rng.integers(0, max(1, height - 40))
        w = rng.integers(min(20, width // 4), max(min(20, width // 4) + 1, width // 3))
        h = rng.integers(min(20, height // 4), max(min(20, height // 4) + 1, height // 3))
        img[y0 : y0 + h, x0 : x0 + w] = rng.uniform(0, 255, 3)
    img += rng.normal(0, noise, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: Image.Image | np.ndarray, fmt: str = "JPEG", **params: object) -> bytes:
    """Encode ``img`` (PIL or HWC/HW array) to bytes in ``fmt``."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()
