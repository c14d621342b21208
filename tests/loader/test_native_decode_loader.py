"""The loader's decode with the native JPEG path (fastload.decode.image) gives the
batches the Pillow path gives, through 0 and 2 worker processes and the loader's
threads, for a mix of JPEG kinds (4:2:0, 4:4:4, progressive, grayscale, CMYK,
restart markers) and a PNG."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import _native
from fastload.decode._deps import NATIVE_DECODER_ENV

pytestmark = pytest.mark.skipif(not _native.HAVE_JPEG, reason="built without libjpeg-turbo")


def _image(i: int) -> tuple[str, bytes]:
    rng = np.random.default_rng(i)
    h, w = (97, 131) if i % 2 else (120, 90)
    base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    smooth = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))[:h, :w]
    noisy = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(noisy)
    kind = i % 7
    buf = io.BytesIO()
    if kind == 0:
        img.save(buf, "JPEG", quality=90, subsampling=2)
    elif kind == 1:
        img.save(buf, "JPEG", quality=95, subsampling=0)
    elif kind == 2:
        img.save(buf, "JPEG", quality=85, progressive=True)
    elif kind == 3:
        img.convert("L").save(buf, "JPEG", quality=90)
    elif kind == 4:
        img.convert("CMYK").save(buf, "JPEG", quality=90)
    elif kind == 5:
        img.save(buf, "JPEG", quality=90, restart_marker_blocks=3)
    else:
        img.save(buf, "PNG")
        return "png", buf.getvalue()
    return "jpg", buf.getvalue()


def _shards(tmp_path: Path, n: int) -> str:
    url = f"file://{tmp_path}/shards"
    with fastload.ShardWriter(url, shard_size="60KB") as w:
        for i in range(n):
            ext, data = _image(i)
            # one field name for every sample, so that batches stack: the decoder reads
            # the kind from the bytes, not the extension
            w.write({"__key__": f"s{i:05d}", "jpg": data, "cls": i % 3, "kind": ext})
    return url


def _epoch(url: str, workers: int, transport: str) -> list[tuple[list[str], torch.Tensor]]:
    ds = fastload.ShardedDataset(url, decode="tensor", size=(40, 48))
    loader = fastload.DataLoader(
        ds, batch_size=8, num_workers=workers, shuffle=False, transport=transport
    )
    try:
        return [(list(b["__key__"]), b["jpg"].clone()) for b in loader]
    finally:
        loader.close()


@pytest.mark.parametrize(("workers", "transport"), [(0, "auto"), (2, "auto"), (2, "cache")])
def test_loader_batches_equal_the_pillow_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, transport: str
) -> None:
    url = _shards(tmp_path, 42)
    monkeypatch.delenv(NATIVE_DECODER_ENV, raising=False)
    native = _epoch(url, workers, transport)
    monkeypatch.setenv(NATIVE_DECODER_ENV, "pillow")  # inherited by the workers
    pillow = _epoch(url, workers, transport)
    assert sum(len(keys) for keys, _ in native) == 42
    assert len(native) == len(pillow)
    for (keys_a, a), (keys_b, b) in zip(native, pillow, strict=True):
        assert keys_a == keys_b
        assert a.shape == b.shape
        assert a.shape[1:] == (3, 40, 48)
        assert torch.equal(a, b)
