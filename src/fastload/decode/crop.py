"""Region and scale decode: a crop of an image, decoded without decoding the rest.

For a JPEG, the native decoder (``csrc/jpeg_crop.cc``, libjpeg-turbo's
``jpeg_crop_scanline``/``jpeg_skip_scanlines``) runs the inverse DCT, upsampling and
colour conversion only for the crop's columns and rows, and with an output size at
the smallest DCT scale (1/1, 1/2, 1/4, 1/8: Pillow's ``draft`` rule, applied to the
crop) that still covers it. Without the native decoder (built without libjpeg, a
CMYK/YCCK JPEG, or another format) Pillow gives the same crop: draft, full decode,
crop, resize. EXIF orientation is not applied, as in :func:`decode_image`.

Boxes are ``(left, top, width, height)`` in the original image's pixels; sizes are
``(height, width)`` as everywhere in :mod:`fastload.decode`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastload.config import MAX_IMAGE_PIXELS, env
from fastload.decode._deps import pil_image
from fastload.decode.image import _WIDE_MODES, _resample, open_image
from fastload.errors import ConfigError, CorruptImageError, DecodeError

__all__ = [
    "CROP_DECODERS",
    "CROP_DECODER_ENV",
    "crop_decoder",
    "crop_scale",
    "cut_pixels",
    "decode_crop",
    "image_size",
]

#: ``decoder=`` of :func:`decode_crop`: ``"native"`` (libjpeg-turbo region decode,
#: JPEGs; other formats and CMYK JPEGs still go through Pillow), ``"pillow"`` (draft,
#: full decode, crop), ``"auto"``: the environment variable :data:`CROP_DECODER_ENV`
#: if set, else native where the extension was built with libjpeg.
CROP_DECODERS: tuple[str, ...] = ("auto", "native", "pillow")
#: Environment variable that picks the decoder for ``decoder="auto"`` (``native`` or
#: ``pillow``): forces the Pillow path, e.g. for tests or a suspected decoder bug.
CROP_DECODER_ENV = "FASTLOAD_CROP_DECODER"

Box = tuple[int, int, int, int]
# The filter support (in input pixels at scale 1) of Pillow's resample filters.
_SUPPORT = {0: 0.5, 1: 3.0, 2: 1.0, 3: 2.0, 4: 0.5, 5: 1.0}
# what _native.JpegError's second argument says (csrc/jpeg_crop.h JpegErrorKind)
_KIND_CORRUPT, _KIND_TRUNCATED, _KIND_UNSUPPORTED, _KIND_TOO_LARGE = 1, 2, 3, 4


def _native() -> Any | None:
    try:
        from fastload import _native
    except ImportError:  # pragma: no cover - the extension is built in the test venv
        return None
    return _native if getattr(_native, "HAVE_JPEG", False) else None


def crop_decoder(decoder: str = "auto") -> str:
    """Resolve ``decoder`` (one of :data:`CROP_DECODERS`) to ``"native"`` or ``"pillow"``.

    ``"auto"`` reads :data:`CROP_DECODER_ENV`, then takes native if available.
    Raises :class:`ConfigError` for an unknown name, or for ``"native"`` when the
    extension was built without libjpeg ("native decode unavailable").
    """
    if decoder not in CROP_DECODERS:
        raise ConfigError(f"decoder must be one of {CROP_DECODERS}, got {decoder!r}")
    if decoder == "auto":
        forced = env(CROP_DECODER_ENV)
        if forced:
            if forced not in ("native", "pillow"):
                raise ConfigError(
                    f"{CROP_DECODER_ENV} must be 'native' or 'pillow', got {forced!r}"
                )
            decoder = forced
        else:
            decoder = "native" if _native() is not None else "pillow"
    if decoder == "native" and _native() is None:
        raise ConfigError(
            "native decode unavailable: fastload._native was built without libjpeg-turbo "
            "(no jpeglib.h at build time); use decoder='pillow' or 'auto'"
        )
    return decoder


def _label(name: str | None) -> str:
    return f"image {name!r}" if name else "image"


def _is_jpeg(data: bytes | bytearray | memoryview) -> bool:
    return bytes(data[:3]) == b"\xff\xd8\xff"


def _native_error(e: Exception, name: str | None) -> Exception:
    message, kind = e.args[0], int(e.args[1])
    if kind in (_KIND_CORRUPT, _KIND_TRUNCATED):
        reason = "truncated" if kind == _KIND_TRUNCATED else "corrupt"
        return CorruptImageError(f"cannot decode {_label(name)}: {message}", reason=reason)
    return DecodeError(f"cannot decode {_label(name)}: {message}")


def image_size(data: bytes | bytearray | memoryview, *, name: str | None = None) -> tuple[int, int]:
    """Return an image's ``(width, height)`` from its header, decoding no pixel.

    Raises :class:`CorruptImageError` if the header is corrupt or cut, and
    :class:`DecodeError` if the data is no image.
    """
    native = _native()
    if native is not None and _is_jpeg(data):
        try:
            width, height, *_ = native.jpeg_info(data)
        except native.JpegError as e:
            raise _native_error(e, name) from e
        return int(width), int(height)
    _img, original, _ = _pillow_open(data, name, load=False)
    return original


def crop_scale(box_width: int, box_height: int, size: tuple[int, int] | None) -> int:
    """The DCT scale denominator (1, 2, 4 or 8) a ``box_width`` x ``box_height`` crop is
    decoded at for an output of ``size`` (``(height, width)``; ``None``: 1): the
    largest that keeps the scaled crop at least as large as the output (Pillow's
    ``draft`` rule)."""
    if size is None:
        return 1
    scale = min(box_width // size[1], box_height // size[0])
    return next((d for d in (8, 4, 2, 1) if scale >= d), 1)


def _check_size(size: Sequence[int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    dims = tuple(size)
    if len(dims) != 2 or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in dims
    ):
        raise ConfigError(f"size must be (height, width) of positive ints, got {size!r}")
    return int(dims[0]), int(dims[1])


def _check_box(box: Sequence[int], width: int, height: int, name: str | None) -> Box:
    try:
        left, top, w, h = (int(v) for v in box)
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in tuple(box))
    except (TypeError, ValueError):
        ints = False
    if not ints:
        raise ConfigError(f"box must be (left, top, width, height) of ints, got {box!r}")
    if w <= 0 or h <= 0 or left < 0 or top < 0 or left + w > width or top + h > height:
        raise ConfigError(
            f"box (left, top, width, height) = {(left, top, w, h)} is not inside "
            f"{_label(name)} of {width}x{height} (width x height)"
        )
    return left, top, w, h


def decode_crop(
    data: bytes | bytearray | memoryview,
    box: Sequence[int] | Callable[[int, int], Sequence[int]],
    *,
    size: Sequence[int] | None = None,
    mode: str = "RGB",
    resample: str | int = "bilinear",
    decoder: str = "auto",
    name: str | None = None,
) -> np.ndarray:
    """Decode the region ``box`` of an image to a writable HWC ``uint8`` array.

    ``box``: ``(left, top, width, height)`` in the image's pixels, or a function of
    the image's ``(width, height)`` (read from the header) returning one, so a crop
    can be drawn from the size before anything is decoded. ``size``: ``(height,
    width)`` of the output: the crop is decoded at the smallest DCT scale that still
    covers it (:func:`crop_scale`), then resized with ``resample`` (Pillow's filter,
    default bilinear with antialiasing); ``None`` returns the crop at full scale.
    ``mode``: ``"RGB"`` (3 channels) or ``"L"`` (1: a JPEG's luma plane).
    ``decoder``: one of :data:`CROP_DECODERS`. ``name`` goes into error messages.

    The native decoder's pixels equal Pillow's full decode at the same scale, then
    crop (tests/decode/test_crop.py). Raises :class:`ConfigError` (a ``ValueError``)
    for a box outside the image, naming the box and the image size, or a bad
    argument; :class:`CorruptImageError` for corrupt or truncated data (``reason``
    says which); :class:`DecodeError` for data that is no image or too many pixels.
    """
    if mode not in ("RGB", "L"):
        raise ConfigError(f"mode must be 'RGB' or 'L', got {mode!r}")
    out_size = _check_size(size)
    filt = _resample(resample)
    use = crop_decoder(decoder)
    native = _native() if use == "native" and _is_jpeg(data) else None
    if native is not None:
        try:
            width, height, _, color_space, _ = native.jpeg_info(data)
        except native.JpegError as e:
            raise _native_error(e, name) from e
        if color_space not in (4, 5):  # CMYK, YCCK: Pillow converts them
            chosen = _check_box(box(width, height) if callable(box) else box, width, height, name)
            return _native_crop(native, data, chosen, (width, height), out_size, mode, filt, name)
    return _pillow_crop(data, box, out_size, mode, filt, name)


def cut_pixels(
    pixels: np.ndarray,
    original: tuple[int, int],
    box: Sequence[int],
    *,
    size: Sequence[int] | None = None,
    resample: str | int = "bilinear",
    name: str | None = None,
) -> np.ndarray:
    """Cut the crop ``box`` of an image from its already decoded ``pixels``: what the
    pixel tier serves for a :class:`~fastload.decode.CropDecoder`'s crop, with no decode.

    ``pixels``: ``(H, W, C)`` uint8 (C 1, 3 or 4), decoded from an image whose size was
    ``original`` (``(width, height)``) and stored at ``(W, H)`` (e.g. bounded by
    ``PixelCache(max_side=...)``). ``box``: ``(left, top, width, height)`` in the
    original's pixels, scaled by ``W / width`` and ``H / height`` to the stored pixels.
    With ``size`` (``(height, width)``) the scaled box (as floats) is resized to it by
    Pillow's ``resize(..., box=...)`` with ``resample`` on the stored image; without, the
    scaled box rounded to whole pixels is returned (the box itself when the pixels are
    at full size). Returns a new HWC uint8 array. Raises :class:`ConfigError` for a box
    outside the original image, naming ``name``, the box and the size.
    """
    ow, oh = int(original[0]), int(original[1])
    left, top, w, h = _check_box(box, ow, oh, name)
    sh, sw, channels = pixels.shape
    sx, sy = sw / ow, sh / oh
    out_size = _check_size(size)
    if out_size is None:
        x0, y0 = min(round(left * sx), sw - 1), min(round(top * sy), sh - 1)
        x1 = min(max(x0 + 1, round((left + w) * sx)), sw)
        y1 = min(max(y0 + 1, round((top + h) * sy)), sh)
        return np.array(pixels[y0:y1, x0:x1], dtype=np.uint8, copy=True)
    filt = _resample(resample)
    image = pil_image()
    modes = {1: "L", 3: "RGB", 4: "RGBA"}
    if channels not in modes:
        raise ConfigError(f"pixels of {_label(name)} have {channels} channels, not 1, 3 or 4")
    img = image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, modes[channels])
    scaled = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    return _array(img.resize((out_size[1], out_size[0]), filt, box=scaled))


def _scaled_window(
    box: Box, denom: int, scaled: tuple[int, int], out_size: tuple[int, int] | None, filt: int
) -> tuple[Box, tuple[float, float, float, float]]:
    """The region to decode at scale 1/``denom`` (``scaled``: the image's scaled
    ``(width, height)``) and the crop's float box inside it: the region covers the
    resize filter's support, so the resize reads the pixels a full image gives it."""
    left, top, w, h = box
    fx0, fy0, fx1, fy1 = left / denom, top / denom, (left + w) / denom, (top + h) / denom
    if out_size is None:
        mx = my = 0
    else:
        support = _SUPPORT.get(filt, 3.0)
        mx = math.ceil(support * max((fx1 - fx0) / out_size[1], 1.0)) + 1
        my = math.ceil(support * max((fy1 - fy0) / out_size[0], 1.0)) + 1
    ix0, iy0 = max(0, math.floor(fx0) - mx), max(0, math.floor(fy0) - my)
    ix1, iy1 = min(scaled[0], math.ceil(fx1) + mx), min(scaled[1], math.ceil(fy1) + my)
    return (ix0, iy0, ix1 - ix0, iy1 - iy0), (fx0 - ix0, fy0 - iy0, fx1 - ix0, fy1 - iy0)


def _native_crop(
    native: Any,
    data: bytes | bytearray | memoryview,
    box: Box,
    original: tuple[int, int],
    out_size: tuple[int, int] | None,
    mode: str,
    filt: int,
    name: str | None,
) -> np.ndarray:
    gray = mode == "L"
    if out_size is None:
        region, denom = box, 1
    else:
        denom = crop_scale(box[2], box[3], out_size)
        scaled = (-(-original[0] // denom), -(-original[1] // denom))
        region, inner = _scaled_window(box, denom, scaled, out_size, filt)
    try:
        arr = native.decode_jpeg_region(data, *region, denom, gray, MAX_IMAGE_PIXELS)
    except native.JpegError as e:
        raise _native_error(e, name) from e
    if out_size is None:
        return arr
    image = pil_image()
    img = image.fromarray(arr[:, :, 0] if gray else arr, mode)
    return _array(img.resize((out_size[1], out_size[0]), filt, box=inner))


def _array(img: Any) -> np.ndarray:
    arr = np.array(img, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def _pillow_open(
    data: bytes | bytearray | memoryview, name: str | None, *, load: bool
) -> tuple[Any, tuple[int, int], Any]:
    try:
        return open_image(data, name=name, load=load)
    except DecodeError as e:
        if bytes(data[:2]) == b"\xff\xd8" and "not an image" in str(e):
            # a JPEG start marker, but a header Pillow cannot read: cut or damaged
            raise CorruptImageError(
                f"cannot decode {_label(name)}: corrupt data (a JPEG whose header "
                f"Pillow cannot read: {e.__cause__})"
            ) from e.__cause__
        raise _pillow_error(e) from e.__cause__


def _pillow_error(e: DecodeError) -> DecodeError:
    text = str(e)
    if "truncated" in text.lower():
        return CorruptImageError(text, reason="truncated")
    if ": corrupt data" in text:
        return CorruptImageError(text, reason="corrupt")
    return e


def _pillow_crop(
    data: bytes | bytearray | memoryview,
    box: Sequence[int] | Callable[[int, int], Sequence[int]],
    out_size: tuple[int, int] | None,
    mode: str,
    filt: int,
    name: str | None,
) -> np.ndarray:
    """Pillow's crop: draft to the scale :func:`crop_scale` picks, decode the whole
    image, crop, resize."""
    img, (width, height), _ = _pillow_open(data, name, load=False)
    chosen = _check_box(box(width, height) if callable(box) else box, width, height, name)
    denom = crop_scale(chosen[2], chosen[3], out_size)
    try:
        if img.format in ("JPEG", "MPO") and (denom > 1 or mode == "L"):
            # asks Pillow for the same 1/denom scale (and the luma plane for "L")
            img.draft(mode, (width // denom, height // denom))
        img.load()
        if img.mode in _WIDE_MODES:
            raise ValueError(f"unsupported mode {img.mode!r}: more than 8 bits per channel")
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")
        if img.mode != mode:
            img = img.convert(mode)
    except Exception as e:
        raise _pillow_error(
            DecodeError(f"cannot decode {_label(name)}: {_explain_pillow(e)}")
        ) from e
    scaled = img.size
    region, inner = _scaled_window(chosen, denom, scaled, out_size, filt)
    if out_size is None:
        left, top, w, h = chosen
        return _array(img.crop((left, top, left + w, top + h)))
    # the same window as the native path, so the resize sees the same floats
    left, top, w, h = region
    window = img.crop((left, top, left + w, top + h))
    return _array(window.resize((out_size[1], out_size[0]), filt, box=inner))


def _explain_pillow(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if "truncated" in text or isinstance(e, EOFError):
        return f"truncated data ({text})"
    return f"corrupt data ({type(e).__name__}: {text})"
