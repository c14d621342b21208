"""Whole-image JPEG decode by the native decoder (``decode="tensor"``'s fast path):
byte-equal to the Pillow path it replaces, for every kind of JPEG, and Pillow's result
or error wherever the native decoder does not take the image."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import _native
from fastload.decode import Decoder, decode_tensor, output_size
from fastload.decode._deps import NATIVE_DECODER_ENV
from fastload.decode.image import _ImageOptions, _native_unsized
from fastload.errors import DecodeError

from .images import encode, photo_like

pytestmark = pytest.mark.skipif(not _native.HAVE_JPEG, reason="built without libjpeg-turbo")


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotated (neither path applies it)
    exif[0x010F] = "fastload"
    return exif.tobytes()


def _kinds() -> dict[str, tuple[bytes, bool]]:
    """name -> (JPEG bytes, whether the native decoder takes it for an RGB output)."""
    rgb = photo_like(641, 479, seed=3)
    small = photo_like(37, 23, seed=4)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    return {
        "420": (encode(rgb, quality=90, subsampling=2), True),
        "422": (encode(rgb, quality=85, subsampling=1), True),
        "444": (encode(rgb, quality=95, subsampling=0), True),
        "progressive": (encode(rgb, quality=90, progressive=True), True),
        "progressive_444": (encode(rgb, quality=80, progressive=True, subsampling=0), True),
        "restart_rows": (encode(rgb, quality=90, restart_marker_rows=1), True),
        "restart_blocks": (encode(rgb, quality=90, restart_marker_blocks=5), True),
        "exif": (encode(rgb, quality=90, exif=_exif()), True),
        "grayscale": (encode(gray, quality=90), True),
        "gray_progressive": (encode(gray, quality=90, progressive=True), True),
        "odd_small": (encode(small, quality=90), True),
        "one_pixel": (encode(small[:1, :1], quality=90), True),
        "tall_odd": (encode(photo_like(97, 1013, seed=5), quality=75, subsampling=2), True),
        "cmyk": (encode(Image.fromarray(rgb).convert("CMYK"), quality=90), False),
    }


KINDS = _kinds()
SETTINGS = [
    {"size": 224, "resize": "exact"},
    {"size": 224, "resize": "shorter"},
    {"size": (60, 100), "resize": "exact"},
    {"size": 30, "resize": "longer", "resample": "bicubic"},
    {"size": 64, "resize": "exact", "resample": "nearest"},
    {"size": 224, "resize": "exact", "resizer": "pil"},
    {"size": 224, "resize": "exact", "draft": False},
    {"size": 224, "resize": "exact", "mode": "L"},
    {"size": 700, "resize": "exact", "mode": "L"},
    {"size": None},
]


def _pillow(monkeypatch: pytest.MonkeyPatch, data: bytes, **kw: object) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setenv(NATIVE_DECODER_ENV, "pillow")
        return decode_tensor(data, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "setting"), list(itertools.product(KINDS, range(len(SETTINGS)))))
def test_native_whole_decode_equals_pillow_path(
    monkeypatch: pytest.MonkeyPatch, kind: str, setting: int
) -> None:
    data, native_rgb = KINDS[kind]
    kw = SETTINGS[setting]
    monkeypatch.delenv(NATIVE_DECODER_ENV, raising=False)
    opts = _ImageOptions(
        kw.get("size"),  # type: ignore[arg-type]
        str(kw.get("mode", "RGB")),
        str(kw.get("resize", "shorter")),
        bool(kw.get("draft", True)),
        str(kw.get("resample", "bilinear")),
        kind,
    )
    took = _native_unsized(data, opts) is not None
    if kw.get("mode") == "L" and kind not in ("grayscale", "gray_progressive"):
        # the luma plane only where Pillow drafts to "L" (the output smaller than the image)
        width, height = Image.open(io.BytesIO(data)).size
        out_w, out_h = output_size(width, height, kw["size"], "exact")  # type: ignore[arg-type]
        expected = native_rgb and out_w < width and out_h < height
    else:
        expected = native_rgb
    assert took == expected
    new = decode_tensor(data, **kw)  # type: ignore[arg-type]
    old = _pillow(monkeypatch, data, **kw)
    assert new.shape == old.shape
    assert new.dtype == old.dtype == torch.uint8
    assert torch.equal(new, old), f"{kind} {kw}: max diff {(new.int() - old.int()).abs().max()}"


def test_decoder_and_out_slot_equal_pillow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NATIVE_DECODER_ENV, raising=False)
    decoder = Decoder(image="tensor", size=224, resize="exact")
    for kind, (data, _) in KINDS.items():
        new = decoder({"__key__": kind, "jpg": data})["jpg"]
        slot = torch.zeros((224, 224, 3), dtype=torch.uint8)
        into = decode_tensor(data, size=224, resize="exact", layout="HWC", out=slot)
        assert into.data_ptr() == slot.data_ptr()
        with monkeypatch.context() as m:
            m.setenv(NATIVE_DECODER_ENV, "pillow")
            old = decoder({"__key__": kind, "jpg": data})["jpg"]
        assert torch.equal(new, old), kind
        assert torch.equal(slot.permute(2, 0, 1), old), kind


@pytest.mark.parametrize("cut", ["truncated", "corrupt", "not_jpeg"])
def test_bad_jpeg_gives_the_pillow_paths_error(monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    data = KINDS["420"][0]
    if cut == "truncated":
        bad = data[: len(data) // 2]
    elif cut == "corrupt":
        bad = data[:3] + b"\x00" * 40 + data[43:]
    else:
        bad = b"\xff\xd8\xff" + b"nothing but noise" * 10
    monkeypatch.delenv(NATIVE_DECODER_ENV, raising=False)
    outcomes = []
    for forced in (None, "pillow"):
        with monkeypatch.context() as m:
            if forced:
                m.setenv(NATIVE_DECODER_ENV, forced)
            try:
                outcomes.append(decode_tensor(bad, size=224, resize="exact", name="x.jpg"))
            except DecodeError as e:
                outcomes.append(f"{type(e).__name__}: {e}")
    new, old = outcomes
    if isinstance(old, torch.Tensor):
        assert isinstance(new, torch.Tensor)
        assert torch.equal(new, old)
    else:
        assert new == old
        assert "x.jpg" in old


def test_the_self_check_finds_the_native_decoder_agrees_with_pillow() -> None:
    # where it did not (another libjpeg build), the tensor decode would stay on Pillow
    # and the byte-equality tests above would still hold; here it must agree, or the
    # native path (and its speed) would be off without a word
    from fastload.decode.image import _check_agreement, _native_agrees

    assert _check_agreement(_native)
    assert _native_agrees(_native)
    data = KINDS["420"][0]
    opts = _ImageOptions(224, "RGB", "exact", True, "bilinear", "x")
    assert _native_unsized(data, opts) is not None
