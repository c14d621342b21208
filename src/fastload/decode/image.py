"""Image decoding with Pillow (or Pillow-SIMD), with JPEG draft mode for reduced decodes.

When the requested output is smaller than a JPEG, ``Image.draft`` makes libjpeg
decode at 1/2, 1/4 or 1/8 scale (DCT scaling), so it produces 4-64x fewer pixels;
the largest reduction that still leaves the image at least as large as the target
is chosen, and a resize with a good filter then gives the exact size.

Sizes given as tuples are ``(height, width)``, like ``torchvision.transforms.Resize``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fastload.config import MAX_IMAGE_PIXELS
from fastload.decode._deps import native_jpeg, pil_image, torch_module
from fastload.errors import ConfigError, DecodeError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image as PILImage

__all__ = [
    "IMAGE_FORMATS",
    "RESIZERS",
    "RESIZE_MODES",
    "decode_image",
    "decode_tensor",
    "open_image",
    "output_size",
    "to_numpy",
    "to_tensor",
]

#: ``shorter``: the shorter side becomes ``size`` (an int), aspect kept — torchvision's
#: ``Resize(int)``; ``longer``: the longer side becomes ``size`` (fits in a square);
#: ``exact``: the output is exactly ``size`` (an int for a square or ``(height, width)``).
RESIZE_MODES: tuple[str, ...] = ("shorter", "longer", "exact")
#: The formats :func:`open_image` (every decode in fastload: datasets, converters,
#: labels) tries; a fixed list keeps identification of arbitrary bytes fast and away
#: from rarely used plugins (EPS would hand the bytes to Ghostscript).
IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
_MODES = ("RGB", "RGBA", "L")
_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")
_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}

Size = int | tuple[int, int] | Sequence[int]


def output_size(
    width: int, height: int, size: Size | None, resize: str = "shorter"
) -> tuple[int, int]:
    """Return the ``(width, height)`` an image of ``width`` x ``height`` is resized to.

    ``size``/``resize`` as in :func:`decode_image`; ``size=None`` keeps the size.
    Raises :class:`ConfigError` for a bad ``size`` or ``resize``.
    """
    if size is None:
        return width, height
    if resize not in RESIZE_MODES:
        raise ConfigError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    if isinstance(size, bool):
        raise ConfigError(f"size must be an int or (height, width), got {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise ConfigError(f"size must be positive, got {size}")
        if resize == "exact":
            return size, size
        short, long = (width, height) if width <= height else (height, width)
        if resize == "shorter":
            new_short, new_long = size, max(1, int(size * long / short))
        else:
            new_short, new_long = max(1, int(size * short / long)), size
        return (new_short, new_long) if width <= height else (new_long, new_short)
    dims = tuple(size)
    if len(dims) != 2 or not all(isinstance(d, int) and d > 0 for d in dims):
        raise ConfigError(f"size must be an int or (height, width) of positive ints, got {size!r}")
    if resize != "exact":
        raise ConfigError(
            f"size {size!r} is (height, width): use resize='exact', or an int size with "
            f"resize={resize!r}"
        )
    return dims[1], dims[0]


def _label(name: str | None) -> str:
    return f"image {name!r}" if name else "image"


def _explain(e: BaseException) -> str:
    image = pil_image()
    text = str(e) or type(e).__name__
    if isinstance(e, image.UnidentifiedImageError):
        return "not an image (no decoder recognises the data)"
    if isinstance(e, image.DecompressionBombError):
        return f"too many pixels ({text})"
    if "truncated" in text or isinstance(e, EOFError):
        return f"truncated data ({text})"
    return f"corrupt data ({type(e).__name__}: {text})"


def open_image(
    data: bytes | bytearray | memoryview,
    *,
    draft_size: tuple[int, int] | Callable[[int, int], tuple[int, int]] | None = None,
    draft_mode: str | None = None,
    name: str | None = None,
    max_pixels: int | None = None,
    load: bool = True,
) -> tuple[PILImage.Image, tuple[int, int], tuple[float, float, float, float] | None]:
    """Open and fully decode an image, drafting a JPEG down towards ``draft_size``: the
    one place fastload turns bytes into pixels.

    Only :data:`IMAGE_FORMATS` are tried, and an image of more than ``max_pixels``
    (default :data:`fastload.config.MAX_IMAGE_PIXELS`) is refused from its header,
    before any pixel is allocated. ``draft_size`` is ``(width, height)``, or a
    function of the original ``(width, height)`` returning it: a JPEG is decoded at
    the largest 1/2, 1/4 or 1/8 scale that is still at least that large. With
    ``load=False`` the image is only identified (header checks, no decode). Returns
    ``(image, original (width, height), box)`` where ``box`` is the region of the
    decoded image that the original covers (``None`` if not drafted). Raises
    :class:`DecodeError` naming ``name``.
    """
    image = pil_image()
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    try:
        img = image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        original = img.size
        if original[0] * original[1] > limit:
            # Pillow only warns below twice its own (global, mutable) limit; a bad
            # header must not make us allocate gigabytes.
            raise image.DecompressionBombError(
                f"{original[0]}x{original[1]} = {original[0] * original[1]} pixels, above "
                f"the cap of {limit} (fastload.config.MAX_IMAGE_PIXELS)"
            )
        box = None
        wanted = draft_size(*original) if callable(draft_size) else draft_size
        if (
            wanted is not None
            and img.format in ("JPEG", "MPO")  # MPO: camera JPEGs with extra frames
            and wanted[0] < original[0]
            and wanted[1] < original[1]
        ):
            drafted = img.draft(draft_mode, wanted)
            if drafted is not None and img.size != original:
                box = drafted[1]
        if img.format in ("JPEG", "MPO"):
            # the whole JPEG to libjpeg in one call, not 64 KiB at a time (each
            # suspension re-decodes the interrupted row: ~2.5% of a COCO-sized decode)
            img.decodermaxblock = max(int(img.decodermaxblock), len(data) + 1)
        if load:
            img.load()
    except ConfigError:
        raise
    except Exception as e:
        # Pillow signals bad data with many exception types (OSError, SyntaxError,
        # ValueError, struct.error, ...): all of them mean this sample is bad.
        raise DecodeError(f"cannot decode {_label(name)}: {_explain(e)}") from e
    return img, original, box


def _resample(resample: str | int) -> int:
    if isinstance(resample, str):
        if resample not in _RESAMPLE:
            raise ConfigError(f"resample must be one of {sorted(_RESAMPLE)}, got {resample!r}")
        return _RESAMPLE[resample]
    return int(resample)


def decode_image(
    data: bytes | bytearray | memoryview,
    *,
    size: Size | None = None,
    mode: str | None = "RGB",
    resize: str = "shorter",
    draft: bool = True,
    resample: str | int = "bilinear",
    name: str | None = None,
) -> PILImage.Image:
    """Decode ``data`` to a PIL image of ``mode``, resized to ``size`` if given.

    ``size``: an int (see ``resize``) or ``(height, width)`` with ``resize="exact"``;
    ``mode``: ``"RGB"``, ``"RGBA"``, ``"L"`` or ``None`` to keep the decoded mode
    (grayscale, CMYK, palette images are converted). With ``draft`` a JPEG larger
    than the output is decoded at reduced scale first. ``resample`` names the resize
    filter (default bilinear with antialiasing, like torchvision). ``name`` (e.g.
    ``"000139.jpg"``) is put into error messages.

    Returns the image. Raises :class:`DecodeError` for data that is not a (whole)
    image, or cannot be converted to ``mode`` (16-bit, 32-bit and float images are
    refused rather than clipped to 8 bits); :class:`ConfigError` for bad arguments.
    """
    return _decode_image(data, _ImageOptions(size, mode, resize, draft, resample, name))[0]


@dataclass(frozen=True)
class _ImageOptions:
    """The settings an image is decoded with: :func:`decode_image`'s keywords, in one
    place for :func:`decode_image`, :func:`decode_tensor` and the ``Decoder``."""

    size: Size | None
    mode: str | None
    resize: str
    draft: bool
    resample: str | int
    name: str | None


def _decode_image(
    data: bytes | bytearray | memoryview, opts: _ImageOptions
) -> tuple[PILImage.Image, tuple[int, int]]:
    """:func:`decode_image`, also returning the original ``(width, height)``."""
    img, original, target, box, filt = _decode_unsized(data, opts)
    if target is not None and (target != img.size or box is not None):
        img = _resize_pil(img, target, filt, box, opts.mode, opts.name)
    return img, original


def _decode_unsized(
    data: bytes | bytearray | memoryview, opts: _ImageOptions
) -> tuple[
    PILImage.Image,
    tuple[int, int],
    tuple[int, int] | None,
    tuple[float, float, float, float] | None,
    int,
]:
    """Decode (drafted) and convert to ``mode``, not yet resized: returns ``(image,
    original (width, height), target (width, height) or None, draft box or None,
    Pillow filter)``; the resize (Pillow's or torch's) is the caller's."""
    size, mode, resize, name = opts.size, opts.mode, opts.resize, opts.name
    if mode is not None and mode not in _MODES:
        raise ConfigError(f"mode must be one of {_MODES} or None, got {mode!r}")
    filt = _resample(opts.resample)
    # Validate size/resize before touching the data, so argument errors are not
    # reported as bad samples.
    output_size(64, 64, size, resize)
    sized = None if size is None else (lambda w, h: output_size(w, h, size, resize))
    # Drafting to "L" lets libjpeg skip the chroma planes; other modes decode as stored.
    img, original, box = open_image(
        data,
        draft_size=sized if opts.draft else None,
        draft_mode="L" if mode == "L" else None,
        name=name,
    )
    target = None if sized is None else sized(*original)
    if mode is not None and img.mode in _WIDE_MODES:
        # Pillow would clip 16/32-bit and float values to 0..255 without a word.
        raise DecodeError(
            f"cannot decode {_label(name)}: unsupported mode {img.mode!r} for output mode "
            f"{mode!r} (more than 8 bits per channel; decode it as a label image or with "
            "mode=None)"
        )
    try:
        if mode is not None and img.mode != mode:
            if img.mode == "P" and "transparency" in img.info:
                img = img.convert("RGBA")
            img = img.convert(mode)
    except (ValueError, OSError) as e:
        raise DecodeError(
            f"cannot decode {_label(name)}: unsupported mode {img.mode!r} for output "
            f"mode {mode!r} ({e})"
        ) from e
    return img, original, target, box, filt


def to_numpy(img: PILImage.Image) -> np.ndarray:
    """Return the pixels of ``img`` as a writable ``uint8`` array ``(H, W, C)``.

    Grayscale gives ``C == 1``. Raises :class:`ConfigError` for modes that are not
    8-bit per channel (use :func:`fastload.decode.label_to_numpy` for label images).
    """
    if img.mode not in ("RGB", "RGBA", "L", "CMYK", "LA", "RGBX"):
        raise ConfigError(f"to_numpy needs an 8-bit image, got mode {img.mode!r}")
    # np.array copies once out of PIL's buffer: the result must be writable for
    # torch.from_numpy and transforms that work in place.
    arr = np.array(img, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr


def to_tensor(img: PILImage.Image | np.ndarray, layout: str = "CHW") -> torch.Tensor:
    """Return ``img`` as a ``uint8`` torch tensor, ``(C, H, W)`` or ``(H, W, C)``.

    Shares memory with the array from :func:`to_numpy` (``torch.from_numpy``); CHW is a
    permuted view of the HWC buffer, as torchvision's ``pil_to_tensor`` returns.
    Raises :class:`MissingDependencyError` without torch, :class:`ConfigError` for a
    bad ``layout``.
    """
    if layout not in ("CHW", "HWC"):
        raise ConfigError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    torch = torch_module()
    arr = img if isinstance(img, np.ndarray) else to_numpy(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    tensor = torch.from_numpy(arr)
    return tensor.permute(2, 0, 1) if layout == "CHW" else tensor


#: How :func:`decode_tensor` (and ``Decoder(image="tensor")``) resizes: ``"torch"``
#: with torch's antialiased ``uint8`` kernels (a port of Pillow-SIMD's, AVX2 on x86:
#: 3-5x Pillow's resize here, within 1 level of it for downscales), ``"pil"`` with
#: Pillow's ``resize`` (exactly :func:`decode_image`), ``"auto"``: torch where it
#: applies (an RGB or L image, the bilinear or bicubic filter), Pillow otherwise and
#: under Pillow-SIMD (whose own resize measured 1.5x torch's with the conversion).
RESIZERS: tuple[str, ...] = ("auto", "pil", "torch")
# Pillow filter -> torch's antialiased uint8 kernel (torch.ops.aten)
_TORCH_FILTERS = {2: "_upsample_bilinear2d_aa", 3: "_upsample_bicubic2d_aa"}
# RGBA and LA: Pillow resizes them with premultiplied alpha, torch's kernels do not
_TORCH_MODES = ("RGB", "L")


_KERNELS: dict[int, Callable[..., Any] | None] = {}
_SIMD: list[bool] = []


def _pillow_simd() -> bool:
    """Whether the PIL in use is Pillow-SIMD (its version has a ``.postN`` suffix)."""
    if not _SIMD:
        pil_image()
        import PIL

        _SIMD.append(".post" in str(PIL.__version__))
    return _SIMD[0]


def _torch_kernel(filt: int) -> Callable[..., Any] | None:
    """torch's antialiased uint8 resize for Pillow filter ``filt``, or None."""
    try:
        return _KERNELS[filt]
    except KeyError:
        pass
    name = _TORCH_FILTERS.get(filt)
    kernel = None
    if name is not None:
        torch = torch_module()
        # the direct binding costs ~25 us less per call than the dispatcher's op
        kernel = getattr(torch._C._nn, name, None) or getattr(torch.ops.aten, name, None)
    _KERNELS[filt] = cast("Callable[..., Any] | None", kernel)
    return _KERNELS[filt]


def decode_tensor(
    data: bytes | bytearray | memoryview,
    *,
    size: Size | None = None,
    mode: str | None = "RGB",
    resize: str = "shorter",
    draft: bool = True,
    resample: str | int = "bilinear",
    name: str | None = None,
    layout: str = "CHW",
    resizer: str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``data`` to a ``uint8`` torch tensor, ``(C, H, W)`` (a permuted view of
    an HWC buffer, as :func:`to_tensor` gives) or ``(H, W, C)``.

    Arguments as in :func:`decode_image`; ``resizer`` (:data:`RESIZERS`) chooses whose
    resize runs. ``out``: an ``(H, W, C)`` uint8 tensor of the output's shape (e.g.
    one image of a preallocated channels-last batch) written in place and returned
    (viewed as ``layout``); it must not overlap the input. Raises
    :class:`DecodeError` for bad data, :class:`ConfigError` for bad arguments or an
    ``out`` of the wrong shape, :class:`MissingDependencyError` without torch.
    """
    options = _ImageOptions(size, mode, resize, draft, resample, name)
    hwc = _decode_hwc(data, options, resizer=resizer, out=out)[0]
    if layout not in ("CHW", "HWC"):
        raise ConfigError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    return hwc.permute(2, 0, 1) if layout == "CHW" else hwc


def _decode_hwc(
    data: bytes | bytearray | memoryview,
    opts: _ImageOptions,
    *,
    resizer: str,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[int, int]]:
    """:func:`decode_tensor` as an ``(H, W, C)`` tensor, and the original ``(width,
    height)``."""
    if resizer not in RESIZERS:
        raise ConfigError(f"resizer must be one of {RESIZERS}, got {resizer!r}")
    torch = torch_module()
    mode, name = opts.mode, opts.name
    native = _native_unsized(data, opts)
    img: PILImage.Image | None = None
    if native is None:
        img, original, target, box, filt = _decode_unsized(data, opts)
        img_mode, img_size = img.mode, img.size
    else:
        arr, original, target, box = native
        filt = _resample(opts.resample)
        img_mode, img_size = ("L" if arr.shape[2] == 1 else "RGB"), (arr.shape[1], arr.shape[0])
    sized = target is not None and (target != img_size or box is not None)
    use_torch = resizer == "torch" or (resizer == "auto" and not _pillow_simd())
    kernel = _torch_kernel(filt) if sized and use_torch else None
    if sized and resizer == "torch" and (kernel is None or img_mode not in _TORCH_MODES):
        raise ConfigError(
            f"resizer='torch' resizes RGB and L images with the bilinear or bicubic filter, "
            f"not a {img_mode} image with {opts.resample!r}; use resizer='auto'"
        )
    if kernel is not None and img_mode not in _TORCH_MODES:
        kernel = None
    if img is None and (kernel is None and sized):
        img = pil_image().fromarray(arr[:, :, 0] if img_mode == "L" else arr)
    if sized and kernel is None:
        assert img is not None
        img = _resize_pil(img, target, filt, box, mode, name)
    # the native decoder's array is the caller's own (writable, not shared): no copy
    src = torch.from_numpy(to_numpy(img) if img is not None else arr)
    if kernel is None:
        return _into(src, out), original
    assert target is not None
    width, height = target
    # the draft box always starts at (0, 0); torch maps the output onto the input's
    # first box_h x box_w pixels when given the scale out/box, as Pillow does with box=
    scale_h = scale_w = None
    if box is not None:
        if box[0] != 0 or box[1] != 0:  # pragma: no cover - Pillow's drafts start at 0
            assert img is not None
            img = _resize_pil(img, target, filt, box, mode, name)
            return _into(torch.from_numpy(to_numpy(img)), out), original
        scale_h, scale_w = height / box[3], width / box[2]
    dst = _check_out(out, (height, width, src.shape[2]))
    if dst is None:
        dst = torch.empty((height, width, src.shape[2]), dtype=torch.uint8)
    # NCHW views of HWC memory: the channels-last uint8 kernels read and write them
    kernel(
        src.permute(2, 0, 1).unsqueeze(0),
        [height, width],
        False,
        scale_h,
        scale_w,
        out=dst.permute(2, 0, 1).unsqueeze(0),
    )
    return dst, original


# libjpeg colour spaces (1 grayscale, 3 YCbCr) whose native decode is Pillow's, pixel
# for pixel (tests/decode/test_native_whole.py); RGB-stored, CMYK and YCCK JPEGs go
# through Pillow
_NATIVE_SPACES = (1, 3)


def _native_unsized(
    data: bytes | bytearray | memoryview, opts: _ImageOptions
) -> (
    tuple[
        np.ndarray,
        tuple[int, int],
        tuple[int, int] | None,
        tuple[float, float, float, float] | None,
    ]
    | None
):
    """:func:`_decode_unsized` of a JPEG by the native libjpeg-turbo decoder (the GIL
    released, no PIL image, no copy out of one), for an RGB or L output: ``(HWC array,
    original (width, height), target or None, draft box or None)`` with Pillow's
    pixels, draft scale and box. ``None`` where Pillow decodes: no native decoder, not
    a JPEG, a colour space outside ``_NATIVE_SPACES``, too many pixels, an L output
    Pillow converts from RGB, or any error of the native decoder (Pillow then gives
    today's pixels or today's error)."""
    if opts.mode not in ("RGB", "L") or bytes(data[:3]) != b"\xff\xd8\xff":
        return None
    native = native_jpeg()
    if native is None or not _native_agrees(native):
        return None
    try:
        width, height, _, space, _ = native.jpeg_info(data)
    except native.JpegError:
        return None
    if space not in _NATIVE_SPACES or width * height > MAX_IMAGE_PIXELS:
        return None
    target = None if opts.size is None else output_size(width, height, opts.size, opts.resize)
    # open_image's draft rule: Pillow drafts when the output is smaller on both sides,
    # at the largest of 1/8, 1/4, 1/2 that keeps the image at least that large
    drafted = opts.draft and target is not None and target[0] < width and target[1] < height
    denom = 1
    if drafted:
        assert target is not None
        scale = min(width // target[0], height // target[1])
        denom = next((d for d in (8, 4, 2) if scale >= d), 1)
    gray = opts.mode == "L"
    if gray and space != 1 and not drafted:
        return None  # Pillow decodes RGB, then converts to L: not the luma plane
    scaled = (-(-width // denom), -(-height // denom))
    try:
        arr = native.decode_jpeg_region(data, 0, 0, *scaled, denom, gray, MAX_IMAGE_PIXELS)
    except native.JpegError:
        return None
    box = None if denom == 1 else (0.0, 0.0, width / denom, height / denom)
    return arr, (width, height), target, box


_AGREES: list[bool] = []


def _native_agrees(native: Any) -> bool:
    """Whether the native decoder gives Pillow's pixels in this process (the extension
    and Pillow may link different libjpeg-turbo builds): checked once on small
    synthetic JPEGs (4:2:0, progressive 4:4:4, 4:2:2 with restart markers, grayscale;
    an odd size; every draft scale; RGB and luma outputs). Where they differ the
    tensor decode stays on Pillow."""
    if not _AGREES:
        try:
            _AGREES.append(_check_agreement(native))
        except Exception:  # a self-check must never break decoding: Pillow then
            _AGREES.append(False)
    return _AGREES[0]


def _prepare_native() -> None:
    """Run the once-per-process self-check now (a tensor ``Decoder`` calls it when
    made, so that worker processes forked later inherit the answer)."""
    native = native_jpeg()
    if native is not None:
        _native_agrees(native)


def _check_agreement(native: Any) -> bool:
    image = pil_image()
    rng = np.random.default_rng(25)
    blocks = np.kron(rng.integers(0, 256, (9, 11, 3)), np.ones((8, 8, 1)))[:67, :83]
    noisy = np.clip(blocks + rng.integers(-24, 25, blocks.shape), 0, 255).astype(np.uint8)
    rgb = image.fromarray(noisy)
    cases: list[tuple[Any, dict[str, Any]]] = [
        (rgb, {"quality": 90, "subsampling": 2}),
        (rgb, {"quality": 80, "subsampling": 0, "progressive": True}),
        (rgb, {"quality": 85, "subsampling": 1, "restart_marker_blocks": 2}),
        (rgb.convert("L"), {"quality": 90}),
    ]
    width, height = rgb.size
    for img, params in cases:
        buf = io.BytesIO()
        img.save(buf, "JPEG", **params)
        data = buf.getvalue()
        for denom in (1, 2, 4, 8):
            scaled = (-(-width // denom), -(-height // denom))
            wanted = None if denom == 1 else (width // denom, height // denom)
            for gray in (False, True) if denom > 1 or img.mode == "L" else (False,):
                pil = open_image(data, draft_size=wanted, draft_mode="L" if gray else None)[0]
                want = np.asarray(pil.convert("L" if gray else "RGB"))
                got = native.decode_jpeg_region(data, 0, 0, *scaled, denom, gray, MAX_IMAGE_PIXELS)
                if got.shape[:2] != want.shape[:2] or not np.array_equal(
                    got[:, :, 0] if gray else got, want
                ):
                    return False
    return True


def _resize_pil(
    img: PILImage.Image,
    target: tuple[int, int] | None,
    filt: int,
    box: tuple[float, float, float, float] | None,
    mode: str | None,
    name: str | None,
) -> PILImage.Image:
    assert target is not None
    try:
        return img.resize(target, filt, box=box)
    except (ValueError, OSError) as e:
        raise DecodeError(
            f"cannot decode {_label(name)}: unsupported mode {img.mode!r} for output "
            f"mode {mode!r} ({e})"
        ) from e


def _check_out(out: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    if out is None:
        return None
    import torch

    if tuple(out.shape) != shape or out.dtype != torch.uint8:
        raise ConfigError(
            f"out= must be a uint8 tensor of shape {shape} (height, width, channels), got "
            f"{out.dtype} {tuple(out.shape)}"
        )
    return out


def _into(src: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    dst = _check_out(out, tuple(src.shape))
    if dst is None:
        return src
    if dst.device.type == "cpu":
        dst.numpy()[...] = src.numpy()  # numpy: no intra-op threads of torch's copy_
    else:
        dst.copy_(src)
    return dst
