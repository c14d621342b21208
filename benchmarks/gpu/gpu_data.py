"""Data for the GPU check: generated photo-like JPEGs and the datasets over them.

Nothing here touches the GPU; everything is importable with torch, numpy and Pillow
alone (the device machine's system Python).
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def jpeg_bytes(n: int, width: int, height: int, seed: int = 0, quality: int = 90) -> list[bytes]:
    """``n`` distinct photo-like JPEGs (smooth waves, a few hard edges, noise).

    Built in threads (numpy and Pillow's encoder release the GIL), so 256 images of
    640x480 take about a second on a many-core machine.
    """
    from PIL import Image

    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)

    def one(i: int) -> bytes:
        rng = np.random.default_rng(seed * 100_003 + i)
        a, b, c = rng.uniform(0.2, 1.0, 3)
        base = np.stack(
            [
                128 + 100 * np.sin(xx * a / 40 + yy * b / 60),
                128 + 100 * np.cos(yy * c / 35 + a),
                128 + 100 * np.sin((xx + yy) * b / 50 + c),
            ],
            axis=-1,
        )
        for _ in range(4):  # hard edges
            x0, y0 = rng.integers(0, max(1, width - 8)), rng.integers(0, max(1, height - 8))
            base[y0 : y0 + height // 4, x0 : x0 + width // 4] = rng.uniform(0, 255, 3)
        noisy = base + rng.normal(0, 12, base.shape).astype(np.float32)
        img = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        return buf.getvalue()

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, range(n)))


class JpegDataset:
    """Map-style dataset of ``length`` samples cycling over ``blobs``, decoded on the CPU
    the way fastload's CPU path does (:func:`fastload.decode.decode_image`, draft mode,
    exact ``size``): ``{"image": uint8 CHW tensor, "label": int}``.

    ``length`` is independent of the number of distinct images, so an epoch can be made
    longer than the timed window (an epoch end restarts the workers).
    """

    def __init__(self, blobs: list[bytes], size: int, length: int) -> None:
        self.blobs = blobs
        self.size = size
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        from fastload.decode import decode_image

        img = decode_image(self.blobs[i % len(self.blobs)], size=self.size, resize="exact")
        arr = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()
        return {"image": arr, "label": i % 1000}


class RawJpegDataset:
    """As :class:`JpegDataset`, but items keep the encoded bytes (``{"jpg": bytes,
    "label": int}``) for decoding on the GPU; :func:`pack_jpegs` collates them."""

    def __init__(self, blobs: list[bytes], length: int) -> None:
        self.blobs = blobs
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"jpg": self.blobs[i % len(self.blobs)], "label": i % 1000}


def pack_jpegs(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate raw items into ``{"jpg": PackedBytes, "label": int64 tensor}`` (the form
    fastload's raw-field transport delivers)."""
    import torch

    from fastload.packed import PackedBytes

    return {
        "jpg": PackedBytes.from_list([it["jpg"] for it in items]),
        "label": torch.tensor([it["label"] for it in items], dtype=torch.int64),
    }


class PreparedImages:
    """Map-style dataset of ready uint8 CHW tensors (no decode: the feed path alone):
    ``{"image": images[i % distinct], "label": i}``."""

    def __init__(self, n: int, size: int, distinct: int = 64) -> None:
        import torch

        self.n = n
        gen = torch.Generator().manual_seed(0)
        self.images = torch.randint(
            0, 255, (distinct, 3, size, size), dtype=torch.uint8, generator=gen
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        # the label is the index, so a consumer can check which image it got
        return {"image": self.images[i % len(self.images)], "label": i}


class RandomBytes:
    """Map-style dataset of ``{"raw": bytes of ~item_bytes, "label": int}`` with sizes
    that vary by a few percent (like encoded images); :func:`pack_raw` collates."""

    def __init__(self, n: int, item_bytes: int, distinct: int = 64) -> None:
        rng = np.random.default_rng(1)
        self.n = n
        self.items = [
            rng.integers(0, 256, int(item_bytes * rng.uniform(0.95, 1.05)), np.uint8).tobytes()
            for _ in range(distinct)
        ]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"raw": self.items[i % len(self.items)], "label": i}


def pack_raw(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate :class:`RandomBytes` items into ``{"raw": PackedBytes, "label": tensor}``."""
    import torch

    from fastload.packed import PackedBytes

    return {
        "raw": PackedBytes.from_list([it["raw"] for it in items]),
        "label": torch.tensor([it["label"] for it in items], dtype=torch.int64),
    }
