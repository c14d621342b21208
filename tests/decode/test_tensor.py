"""decode_tensor: torch's antialiased resize against Pillow's, in place into a batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.decode import Decoder, decode_image, decode_tensor, to_tensor
from fastload.errors import ConfigError

from .images import encode, photo_like


def _levels(a: torch.Tensor | np.ndarray, b: Image.Image | np.ndarray) -> np.ndarray:
    left = a.numpy() if isinstance(a, torch.Tensor) else a
    right = np.asarray(b)
    if right.ndim == 2:
        right = right[:, :, None]
    return np.abs(left.astype(np.int16) - right.astype(np.int16))


@pytest.mark.parametrize(
    ("wh", "size", "resize"),
    [
        ((640, 480), (224, 224), "exact"),  # drafted at 1/2, box = the whole image
        ((640, 427), 150, "shorter"),  # drafted at 1/2 to 320x214, box (0, 0, 320, 213.5)
        ((641, 481), (224, 224), "exact"),  # odd sizes: box (0, 0, 320.5, 240.5)
        ((1000, 700), (90, 100), "exact"),  # 1/4 and 1/8 territory
        ((300, 200), 224, "shorter"),  # upscaling, not drafted
    ],
)
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_torch_resize_within_one_level_of_pillow(
    wh: tuple[int, int], size: Any, resize: str, mode: str, resample: str
) -> None:
    data = encode(photo_like(*wh, seed=wh[0]), "JPEG", quality=90)
    kw: dict[str, Any] = dict(size=size, resize=resize, mode=mode, resample=resample)
    want = decode_image(data, **kw)
    got = decode_tensor(data, layout="HWC", resizer="torch", **kw)
    assert tuple(got.shape) == (want.size[1], want.size[0], 1 if mode == "L" else 3)
    assert got.dtype == torch.uint8
    diff = _levels(got, want)
    # measured over 4 seeds: bilinear downscales at most 1 level off, bicubic and
    # upscales at most 2; mean <= 0.014
    assert diff.max() <= (1 if resample == "bilinear" and wh[0] >= 640 else 2)
    assert diff.mean() <= 0.02
    # resizer="pil" is decode_image exactly
    pil = decode_tensor(data, layout="HWC", resizer="pil", **kw)
    assert _levels(pil, want).max() == 0


def test_auto_uses_pillow_where_torch_does_not_apply(jpeg_640: bytes) -> None:
    # RGBA (Pillow resizes it premultiplied) and filters torch has no uint8 kernel for
    for kw in ({"mode": "RGBA"}, {"resample": "lanczos"}, {"resample": "box"}):
        want = decode_image(jpeg_640, size=100, **kw)
        got = decode_tensor(jpeg_640, size=100, layout="HWC", **kw)
        assert _levels(got, want).max() == 0, kw
        with pytest.raises(ConfigError, match="resizer='torch'"):
            decode_tensor(jpeg_640, size=100, resizer="torch", **kw)


def test_unresized_is_the_decoded_image(jpeg_640: bytes) -> None:
    full = decode_tensor(jpeg_640, resizer="torch")
    assert torch.equal(full, to_tensor(decode_image(jpeg_640)))
    # a size the draft hits exactly: nothing to resize
    eighth = decode_tensor(jpeg_640, size=(60, 80), resize="exact", resizer="torch")
    assert torch.equal(eighth, to_tensor(decode_image(jpeg_640, size=(60, 80), resize="exact")))


def test_layouts_and_out(jpeg_640: bytes) -> None:
    chw = decode_tensor(jpeg_640, size=(224, 200), resize="exact")
    assert tuple(chw.shape) == (3, 224, 200)
    assert chw.permute(1, 2, 0).is_contiguous()  # a CHW view of HWC memory
    batch = torch.zeros((2, 224, 200, 3), dtype=torch.uint8)
    back = decode_tensor(jpeg_640, size=(224, 200), resize="exact", out=batch[1], layout="HWC")
    assert back.data_ptr() == batch[1].data_ptr()
    assert torch.equal(batch[1], chw.permute(1, 2, 0))
    assert int(batch[0].sum()) == 0  # only its slot was written
    # the same through Pillow's resize (copied into out)
    other = torch.zeros((224, 200, 3), dtype=torch.uint8)
    decode_tensor(jpeg_640, size=(224, 200), resize="exact", out=other, resizer="pil")
    assert torch.equal(
        other, to_tensor(decode_image(jpeg_640, size=(224, 200), resize="exact"), "HWC")
    )
    with pytest.raises(ConfigError, match="out= must be a uint8 tensor of shape"):
        decode_tensor(jpeg_640, size=(224, 200), resize="exact", out=batch)
    with pytest.raises(ConfigError, match="out= must be a uint8 tensor of shape"):
        decode_tensor(jpeg_640, size=8, resize="exact", out=torch.zeros((8, 8, 3)))
    with pytest.raises(ConfigError, match="resizer must be one of"):
        decode_tensor(jpeg_640, resizer="cv2")
    with pytest.raises(ConfigError, match="layout"):
        decode_tensor(jpeg_640, layout="NCHW")


def test_decoder_resizer(jpeg_640: bytes) -> None:
    sample = {"__key__": "k", "jpg": jpeg_640}
    want = decode_image(jpeg_640, size=(224, 224), resize="exact")
    auto = Decoder(image="tensor", size=(224, 224), resize="exact")(sample)["jpg"]
    assert tuple(auto.shape) == (3, 224, 224)
    assert _levels(auto.permute(1, 2, 0), want).max() <= 1
    exact = Decoder(image="tensor", size=(224, 224), resize="exact", resizer="pil")
    assert _levels(exact(sample)["jpg"].permute(1, 2, 0), want).max() == 0
    # NumPy outputs stay Pillow's unless asked
    arr = Decoder(image="numpy", size=(224, 224), resize="exact")(sample)["jpg"]
    assert np.array_equal(arr, np.asarray(want))
    via = Decoder(image="numpy", size=(224, 224), resize="exact", resizer="torch")(sample)["jpg"]
    assert isinstance(via, np.ndarray)
    assert via.shape == (224, 224, 3)
    torch_hwc = decode_tensor(jpeg_640, size=(224, 224), resize="exact", resizer="torch")
    assert np.array_equal(via, torch_hwc.permute(1, 2, 0).numpy())
    hwc = Decoder(image="tensor", size=(224, 224), resize="exact", layout="HWC")(sample)["jpg"]
    assert torch.equal(hwc, auto.permute(1, 2, 0))
    with pytest.raises(ConfigError, match="resizer"):
        Decoder(image="tensor", resizer="opencv")
    with pytest.raises(ConfigError, match="resizer='torch'"):
        Decoder(image="tensor", resizer="torch", mode="RGBA")
    with pytest.raises(ConfigError, match="resizer='torch'"):
        Decoder(image="tensor", resizer="torch", resample="lanczos")


def test_decoder_targets_follow_the_torch_resized_image(jpeg_640: bytes) -> None:
    sample = {
        "__key__": "k",
        "jpg": jpeg_640,
        "json": b'{"annotations": [{"bbox": [64, 48, 64, 48], "category_id": 3}]}',
    }
    out = Decoder(image="tensor", size=(240, 320), resize="exact", targets="tensor")(sample)
    assert tuple(out["jpg"].shape) == (3, 240, 320)
    assert out["target"]["boxes"][0].tolist() == pytest.approx([32, 24, 64, 48])


def test_auto_leaves_the_resize_to_pillow_simd(
    jpeg_640: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    import PIL

    from fastload.decode import image

    assert image._pillow_simd() == (".post" in PIL.__version__)
    kw: dict[str, Any] = dict(size=(224, 224), resize="exact", layout="HWC")
    pil = decode_tensor(jpeg_640, resizer="pil", **kw)
    by_torch = decode_tensor(jpeg_640, resizer="torch", **kw)
    if image._pillow_simd():
        # torch's kernel is a port of Pillow-SIMD's resize: the very same pixels
        assert torch.equal(pil, by_torch)
    else:
        assert not torch.equal(pil, by_torch)  # Pillow's differs somewhere (by 1 level)
    monkeypatch.setattr(image, "_SIMD", [True])  # as if Pillow-SIMD were the PIL in use
    assert torch.equal(decode_tensor(jpeg_640, **kw), pil)
    assert torch.equal(decode_tensor(jpeg_640, resizer="torch", **kw), by_torch)
    monkeypatch.setattr(image, "_SIMD", [False])
    assert torch.equal(decode_tensor(jpeg_640, **kw), by_torch)
