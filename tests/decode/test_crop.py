"""``decode_crop``: region and scale decode, native (libjpeg-turbo) and Pillow paths.

Measured here (libjpeg-turbo 2.1.5 for the native decoder, Pillow 13's bundled
libjpeg-turbo for the reference): the native region equals a full decode at the
same DCT scale, then crop, to 0 levels, over every box tried (4:2:0, 4:4:4, 4:2:2,
grayscale, progressive, odd sizes; scales 1/1 to 1/8): the decoder reads an iMCU of
context around the region, so the upsampling at its edge sees what a full decode
does. Against Pillow the bound asserted is :data:`MAX_DIFF_VS_PILLOW` levels (two
builds of libjpeg-turbo; 0 measured).
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload import _native
from fastload.decode import crop_decoder, crop_scale, decode_crop, decode_image, image_size
from fastload.decode.crop import CROP_DECODER_ENV
from fastload.errors import ConfigError, CorruptImageError, DecodeError

from .images import encode, photo_like

native_only = pytest.mark.skipif(
    not getattr(_native, "HAVE_JPEG", False),
    reason="fastload._native built without libjpeg-turbo (native decode unavailable)",
)

#: Pillow decodes with its own libjpeg-turbo build; both use the exact integer IDCT
MAX_DIFF_VS_PILLOW = 1

W, H = 333, 517  # odd sizes: partial iMCUs at the right and bottom edges


def _jpeg(kind: str, width: int = W, height: int = H) -> bytes:
    arr = photo_like(width, height, seed=7)
    if kind == "420":
        return encode(arr, "JPEG", quality=90, subsampling=2)
    if kind == "444":
        return encode(arr, "JPEG", quality=90, subsampling=0)
    if kind == "422":
        return encode(arr, "JPEG", quality=90, subsampling=1)
    if kind == "gray":
        return encode(Image.fromarray(arr).convert("L"), "JPEG", quality=90)
    if kind == "progressive":
        return encode(arr, "JPEG", quality=90, progressive=True)
    raise AssertionError(kind)


KINDS = ("420", "444", "422", "gray", "progressive")
JPEGS = {k: _jpeg(k) for k in KINDS}
# more sizes: wide and short (many iMCU columns, one iMCU row at 1/8), tiny
OTHER_SIZES = ((1030, 70), (9, 13))
SIZED = {(k, s): _jpeg(k, *s) for k in ("420", "progressive") for s in OTHER_SIZES}
SIZED.update({(k, (W, H)): JPEGS[k] for k in KINDS})


def _pillow_full(data: bytes, denom: int, mode: str = "RGB") -> np.ndarray:
    """Pillow's full decode at 1/denom (draft), as an HWC array."""
    img = Image.open(io.BytesIO(data))
    if denom > 1 or mode == "L":
        img.draft(mode, (img.size[0] // denom, img.size[1] // denom))
    arr = np.asarray(img.convert(mode))
    return arr[:, :, None] if arr.ndim == 2 else arr


def _box(data: st.DataObject, width: int, height: int) -> tuple[int, int, int, int]:
    w = data.draw(st.integers(1, width))
    h = data.draw(st.integers(1, height))
    left = data.draw(st.integers(0, width - w))
    top = data.draw(st.integers(0, height - h))
    return left, top, w, h


@native_only
@pytest.mark.parametrize(
    ("kind", "dims"), sorted(SIZED), ids=[f"{k}-{w}x{h}" for k, (w, h) in sorted(SIZED)]
)
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_native_region_equals_full_decode_then_crop(
    kind: str, dims: tuple[int, int], denom: int, data: st.DataObject
) -> None:
    jpeg = SIZED[(kind, dims)]
    w_s, h_s = -(-dims[0] // denom), -(-dims[1] // denom)
    full = _native.decode_jpeg_region(jpeg, 0, 0, w_s, h_s, denom, False, 0)
    pillow = _pillow_full(jpeg, denom)
    assert full.shape == pillow.shape
    assert int(np.abs(full.astype(np.int16) - pillow).max()) <= MAX_DIFF_VS_PILLOW
    left, top, w, h = _box(data, full.shape[1], full.shape[0])
    region = _native.decode_jpeg_region(jpeg, left, top, w, h, denom, False, 0)
    # same library, same scale: exactly the full decode's pixels
    np.testing.assert_array_equal(region, full[top : top + h, left : left + w])


@native_only
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_decode_crop_native_equals_pillow_path(kind: str, data: st.DataObject) -> None:
    jpeg = JPEGS[kind]
    box = _box(data, W, H)
    size = data.draw(st.sampled_from([None, (32, 32), (64, 48), (224, 224), (17, 300)]))
    mode = data.draw(st.sampled_from(["RGB", "L"]))
    got = decode_crop(jpeg, box, size=size, mode=mode, decoder="native")
    want = decode_crop(jpeg, box, size=size, mode=mode, decoder="pillow")
    channels = 3 if mode == "RGB" else 1
    expected = (box[3], box[2], channels) if size is None else (*size, channels)
    assert got.shape == want.shape == expected
    assert got.dtype == np.uint8
    assert got.flags.writeable
    assert int(np.abs(got.astype(np.int16) - want).max()) <= MAX_DIFF_VS_PILLOW


@pytest.mark.parametrize("decoder", ["native", "pillow"])
def test_crop_without_size_is_full_decode_then_crop(decoder: str) -> None:
    if decoder == "native" and not getattr(_native, "HAVE_JPEG", False):
        pytest.skip("native decode unavailable")
    jpeg = JPEGS["420"]
    full = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    got = decode_crop(jpeg, (10, 20, 100, 50), decoder=decoder)
    assert int(np.abs(got.astype(np.int16) - full[20:70, 10:110]).max()) <= MAX_DIFF_VS_PILLOW


def test_scale_is_the_smallest_that_covers_the_output() -> None:
    assert crop_scale(512, 512, None) == 1
    assert crop_scale(512, 512, (512, 512)) == 1
    assert crop_scale(1023, 1024, (512, 512)) == 1
    assert crop_scale(1024, 1024, (512, 512)) == 2
    assert crop_scale(4096, 2048, (224, 224)) == 8
    assert crop_scale(2000, 900, (224, 224)) == 4  # the shorter ratio decides
    assert crop_scale(100, 100, (224, 224)) == 1  # upscaling: full scale


def test_memoryview_and_bytearray_inputs() -> None:
    jpeg = JPEGS["420"]
    want = decode_crop(jpeg, (3, 4, 50, 60), size=(20, 30))
    for data in (memoryview(jpeg), bytearray(jpeg)):
        np.testing.assert_array_equal(decode_crop(data, (3, 4, 50, 60), size=(20, 30)), want)


def test_callable_box_gets_the_header_size() -> None:
    seen = []

    def centre(width: int, height: int) -> tuple[int, int, int, int]:
        seen.append((width, height))
        return width // 4, height // 4, width // 2, height // 2

    got = decode_crop(JPEGS["420"], centre, size=(64, 64))
    assert seen == [(W, H)]
    assert got.shape == (64, 64, 3)
    assert image_size(JPEGS["420"]) == (W, H)


@pytest.mark.parametrize("decoder", ["native", "pillow"])
@pytest.mark.parametrize(
    "box",
    [
        (0, 0, W + 1, 10),
        (W - 5, 0, 6, 10),
        (0, H, 1, 1),
        (-1, 0, 5, 5),
        (0, 0, 0, 5),
        (3, 3, 5, -2),
    ],
)
def test_box_outside_the_image_is_a_value_error_naming_box_and_size(
    decoder: str, box: tuple[int, int, int, int]
) -> None:
    if decoder == "native" and not getattr(_native, "HAVE_JPEG", False):
        pytest.skip("native decode unavailable")
    with pytest.raises(ValueError, match=r"box .*is not inside image 'x\.jpg' of 333x517") as e:
        decode_crop(JPEGS["420"], box, decoder=decoder, name="x.jpg")
    assert isinstance(e.value, ConfigError)
    assert str(tuple(box)) in str(e.value)


@pytest.mark.parametrize("decoder", ["native", "pillow"])
@pytest.mark.parametrize("kind", ["420", "progressive"])
@pytest.mark.parametrize("cut", [4, 150, 0.3, 0.7, -2])
def test_truncated_jpeg_raises_naming_the_image(decoder: str, kind: str, cut: float) -> None:
    if decoder == "native" and not getattr(_native, "HAVE_JPEG", False):
        pytest.skip("native decode unavailable")
    jpeg = JPEGS[kind]
    end = int(len(jpeg) * cut) if isinstance(cut, float) else cut % len(jpeg)
    # a crop at the top: a baseline decode of it never reaches the cut, and still fails
    with pytest.raises(CorruptImageError, match=r"cannot decode image 'k\.jpg': ") as e:
        decode_crop(jpeg[:end], (0, 0, 8, 8), decoder=decoder, name="k.jpg")
    assert isinstance(e.value, DecodeError)
    if decoder == "native" or end > 1000:
        assert e.value.reason == "truncated"
        assert "truncated data" in str(e.value)
    else:  # Pillow cannot tell a cut header from a damaged one
        assert e.value.reason in ("truncated", "corrupt")


@pytest.mark.parametrize("decoder", ["native", "pillow"])
def test_corrupt_jpeg_raises_corrupt(decoder: str) -> None:
    if decoder == "native" and not getattr(_native, "HAVE_JPEG", False):
        pytest.skip("native decode unavailable")
    jpeg = bytearray(JPEGS["420"])
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 7] = b"\x00\x00"  # height 0 in the frame header
    with pytest.raises(CorruptImageError, match=r"image 'c\.jpg': corrupt data") as e:
        decode_crop(bytes(jpeg), (0, 0, 8, 8), decoder=decoder, name="c.jpg")
    assert e.value.reason == "corrupt"


@native_only
def test_mutated_jpegs_raise_cleanly_or_decode() -> None:
    """Fuzz-style: truncations and bit flips of every kind either decode to an array
    of the asked shape or raise DecodeError: never a crash or another exception."""
    rng = np.random.default_rng(25)
    outcomes = {"ok": 0, "error": 0}
    for kind in KINDS:
        base = JPEGS[kind]
        for _ in range(60):
            data = bytearray(base)
            for _ in range(int(rng.integers(1, 6))):
                pos = int(rng.integers(0, len(data)))
                data[pos] ^= 1 << int(rng.integers(0, 8))
            if rng.random() < 0.3:
                data = data[: int(rng.integers(0, len(data)))]
            box = (int(rng.integers(0, 200)), int(rng.integers(0, 300)), 64, 96)
            size = (32, 32) if rng.random() < 0.5 else None
            try:
                got = decode_crop(bytes(data), box, size=size, decoder="native")
            except DecodeError:
                outcomes["error"] += 1
                continue
            except ConfigError:  # a flipped header size can put the box outside
                outcomes["error"] += 1
                continue
            assert got.shape == ((96, 64, 3) if size is None else (32, 32, 3))
            outcomes["ok"] += 1
    assert outcomes["error"] > 0, outcomes
    assert outcomes["ok"] > 0, outcomes


def test_cmyk_jpeg_goes_through_pillow_like_decode_image() -> None:
    cmyk = Image.fromarray(photo_like(120, 90, seed=3)).convert("CMYK")
    jpeg = encode(cmyk, "JPEG", quality=90)
    want = np.asarray(decode_image(jpeg))[5:65, 10:110]
    got = decode_crop(jpeg, (10, 5, 100, 60))
    np.testing.assert_array_equal(got, want)


def test_png_and_grayscale_outputs() -> None:
    arr = photo_like(100, 80, seed=4)
    png = encode(arr, "PNG")
    np.testing.assert_array_equal(decode_crop(png, (5, 6, 30, 20)), arr[6:26, 5:35])
    gray = decode_crop(png, (5, 6, 30, 20), mode="L")
    assert gray.shape == (20, 30, 1)
    resized = decode_crop(png, (0, 0, 100, 80), size=(40, 50))
    assert resized.shape == (40, 50, 3)


def test_decoder_choice_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CROP_DECODER_ENV, "pillow")
    assert crop_decoder() == "pillow"
    monkeypatch.setenv(CROP_DECODER_ENV, "fast")
    with pytest.raises(ConfigError, match=CROP_DECODER_ENV):
        crop_decoder()
    monkeypatch.delenv(CROP_DECODER_ENV)
    expected = "native" if getattr(_native, "HAVE_JPEG", False) else "pillow"
    assert crop_decoder() == expected
    with pytest.raises(ConfigError, match="decoder must be one of"):
        crop_decoder("turbo")
    with pytest.raises(ConfigError, match="size must be"):
        decode_crop(JPEGS["420"], (0, 0, 4, 4), size=(0, 4))
    with pytest.raises(ConfigError, match="mode must be"):
        decode_crop(JPEGS["420"], (0, 0, 4, 4), mode="RGBA")


def test_corrupt_image_error_pickles_with_its_reason() -> None:
    e = pickle.loads(pickle.dumps(CorruptImageError("cannot decode x", reason="truncated")))
    assert isinstance(e, CorruptImageError)
    assert e.reason == "truncated"
    assert str(e) == "cannot decode x"
