"""Image decoding: sizes, draft mode accuracy and use, modes, arrays/tensors, errors."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastload.decode import (
    backend_info,
    decode_image,
    open_image,
    output_size,
    to_numpy,
    to_tensor,
)
from fastload.errors import ConfigError, DecodeError

from .images import encode, photo_like

# Draft (DCT-scaled) decode + resize vs full decode + resize, same filter, to 224.
# Measured over 8 seeds x {224 shorter, 224x224 exact, 100 shorter} at 640x480:
#   photo-like (noise sigma 4): mean <= 0.77, p99 <= 7, max <= 34 (at hard edges)
#   COCO-sized (noise sigma 18, ~155 KB): mean <= 2.30, p99 <= 9, max <= 35
# Tolerances leave some room over those measurements, nothing more.
TOL_MEAN_PHOTO = 1.0
TOL_MEAN_NOISY = 3.0
TOL_P99 = 12
TOL_MAX = 48


def _full_then_resize(data: bytes, size: tuple[int, int]) -> np.ndarray:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(img.resize(size, Image.Resampling.BILINEAR)).astype(np.int16)


@pytest.mark.parametrize(
    ("width", "height", "size", "resize", "expected"),
    [
        (640, 480, 224, "shorter", (298, 224)),
        (480, 640, 224, "shorter", (224, 298)),
        (640, 480, 224, "longer", (224, 168)),
        (640, 480, 224, "exact", (224, 224)),
        (640, 480, (100, 200), "exact", (200, 100)),
        (640, 480, None, "shorter", (640, 480)),
        (300, 300, 224, "shorter", (224, 224)),
        (100, 50, 224, "shorter", (448, 224)),  # upscaling is allowed
    ],
)
def test_output_size(
    width: int,
    height: int,
    size: int | tuple[int, int] | None,
    resize: str,
    expected: tuple[int, int],
) -> None:
    assert output_size(width, height, size, resize) == expected


@pytest.mark.parametrize(
    ("size", "resize"),
    [(0, "shorter"), (-3, "exact"), ((224, 224), "shorter"), ((1, 2, 3), "exact"), (224, "fit")],
)
def test_output_size_rejects_bad_arguments(size: Any, resize: str) -> None:
    with pytest.raises(ConfigError):
        output_size(640, 480, size, resize)


@pytest.mark.parametrize(
    ("noise", "tol_mean"), [(4.0, TOL_MEAN_PHOTO), (18.0, TOL_MEAN_NOISY)], ids=["photo", "coco"]
)
@pytest.mark.parametrize(
    ("size", "resize"), [(224, "shorter"), ((224, 224), "exact"), (100, "shorter")]
)
def test_draft_matches_full_decode(
    noise: float, tol_mean: float, size: int | tuple[int, int], resize: str
) -> None:
    for seed in range(3):
        data = encode(photo_like(640, 480, seed=seed, noise=noise), "JPEG", quality=90)
        target = output_size(640, 480, size, resize)
        drafted = decode_image(data, size=size, resize=resize, draft=True)
        assert drafted.size == target
        assert drafted.mode == "RGB"
        diff = np.abs(np.asarray(drafted).astype(np.int16) - _full_then_resize(data, target))
        assert diff.mean() <= tol_mean
        assert np.percentile(diff, 99) <= TOL_P99
        assert diff.max() <= TOL_MAX


def test_no_draft_is_exactly_full_decode_then_resize(jpeg_640: bytes) -> None:
    out = decode_image(jpeg_640, size=(224, 224), resize="exact", draft=False)
    assert np.array_equal(np.asarray(out), _full_then_resize(jpeg_640, (224, 224)))


@pytest.mark.parametrize(
    ("target", "decoded_at"),
    [
        ((298, 224), (320, 240)),  # 480 // 224 == 2 -> 1/2
        ((149, 112), (160, 120)),  # 1/4
        ((80, 60), (80, 60)),  # 1/8, exactly the target
        ((79, 59), (80, 60)),  # still 1/8: 1/16 does not exist
        ((400, 300), (640, 480)),  # 480 // 300 == 1 -> no reduction
    ],
)
def test_draft_decodes_at_the_largest_reduction_that_fits(
    jpeg_640: bytes, target: tuple[int, int], decoded_at: tuple[int, int]
) -> None:
    img, original, box = open_image(jpeg_640, draft_size=target)
    assert original == (640, 480)
    assert img.size == decoded_at
    assert img.size[0] >= target[0]
    assert img.size[1] >= target[1]
    if decoded_at == original:
        assert box is None
    else:
        scale = 640 // decoded_at[0]
        assert box == (0, 0, 640 / scale, 480 / scale)


def test_decode_image_uses_draft_for_jpeg(jpeg_640: bytes) -> None:
    # The drafted decode reads 1/4 of the pixels: a 224 shorter-side output of a
    # 640x480 JPEG is made from a 320x240 decode. open_image with a callable target
    # is exactly what decode_image calls.
    def target(w: int, h: int) -> tuple[int, int]:
        return output_size(w, h, 224, "shorter")

    img, _, _ = open_image(jpeg_640, draft_size=target)
    assert img.size == (320, 240)
    drafted = np.asarray(decode_image(jpeg_640, size=224))
    expected = img.convert("RGB").resize(
        (298, 224), Image.Resampling.BILINEAR, box=(0, 0, 320, 240)
    )
    assert np.array_equal(drafted, np.asarray(expected))


def test_png_is_decoded_without_draft() -> None:
    arr = photo_like(320, 200, seed=3)
    data = encode(arr, "PNG")
    img, _, box = open_image(data, draft_size=(80, 50))
    assert img.size == (320, 200)
    assert box is None
    assert np.array_equal(np.asarray(decode_image(data)), arr)
    out = decode_image(data, size=100)
    expected = Image.fromarray(arr).resize((160, 100), Image.Resampling.BILINEAR)
    assert np.array_equal(np.asarray(out), np.asarray(expected))


def test_grayscale_jpeg_becomes_rgb() -> None:
    gray = photo_like(160, 120, seed=1)[:, :, 0]
    data = encode(gray, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "L"
    out = decode_image(data)
    assert out.mode == "RGB"
    ref = np.asarray(Image.open(io.BytesIO(data)))
    rgb = np.asarray(out)
    for c in range(3):
        assert np.array_equal(rgb[:, :, c], ref)
    assert decode_image(data, size=60, mode="L").mode == "L"


def test_cmyk_jpeg_becomes_rgb() -> None:
    cmyk = Image.fromarray(photo_like(160, 120, seed=2, noise=4.0)).convert("CMYK")
    data = encode(cmyk, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    full = Image.open(io.BytesIO(data)).convert("RGB")
    assert np.array_equal(np.asarray(decode_image(data)), np.asarray(full))
    out = decode_image(data, size=60)  # drafted at 1/2, converted, resized
    assert out.mode == "RGB"
    assert out.size == (80, 60)
    ref = np.asarray(full.resize((80, 60), Image.Resampling.BILINEAR)).astype(int)
    # A small image has more edge per output pixel: measured mean 1.44 here.
    assert np.abs(np.asarray(out).astype(int) - ref).mean() <= TOL_MEAN_NOISY


def test_palette_png_with_transparency_and_mode_none() -> None:
    pal = Image.fromarray(photo_like(64, 48, seed=5)).convert("P")
    buf = io.BytesIO()
    pal.save(buf, "PNG", transparency=0)
    data = buf.getvalue()
    assert decode_image(data).mode == "RGB"
    assert decode_image(data, mode="RGBA").mode == "RGBA"
    assert decode_image(data, mode=None).mode == "P"


def test_memoryview_input(jpeg_640: bytes) -> None:
    backing = bytearray(b"xx" + jpeg_640 + b"yy")
    view = memoryview(backing)[2:-2]
    a = decode_image(view, size=224)
    b = decode_image(jpeg_640, size=224)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_to_numpy_and_tensor(jpeg_640: bytes) -> None:
    img = decode_image(jpeg_640, size=(224, 200), resize="exact")
    arr = to_numpy(img)
    assert arr.shape == (224, 200, 3)
    assert arr.dtype == np.uint8
    assert arr.flags.writeable
    assert to_numpy(img.convert("L")).shape == (224, 200, 1)
    chw = to_tensor(arr)
    assert tuple(chw.shape) == (3, 224, 200)
    assert str(chw.dtype) == "torch.uint8"
    # A view of the same memory: no copy was made.
    arr[0, 0, 1] = 7
    assert int(chw[1, 0, 0]) == 7
    hwc = to_tensor(img, layout="HWC")
    assert tuple(hwc.shape) == (224, 200, 3)
    assert np.array_equal(hwc.numpy(), np.asarray(img))
    with pytest.raises(ConfigError):
        to_tensor(img, layout="NCHW")
    with pytest.raises(ConfigError):
        to_numpy(Image.new("I;16", (4, 4)))


def test_truncated_jpeg_names_the_sample(jpeg_640: bytes) -> None:
    with pytest.raises(DecodeError, match=r"'000139\.jpg'.*truncated"):
        decode_image(jpeg_640[: len(jpeg_640) // 2], name="000139.jpg")


@pytest.mark.parametrize("data", [b"", b"hello world", b"\x89PNG\r\n\x1a\n" + b"\0" * 20])
def test_not_an_image(data: bytes) -> None:
    with pytest.raises(DecodeError, match=r"'k\.jpg'"):
        decode_image(data, name="k.jpg")


def test_unidentified_bytes_message() -> None:
    with pytest.raises(DecodeError, match="not an image"):
        decode_image(b"GIF? no, plain text", name="x.jpg")


def test_unsupported_mode_for_output() -> None:
    data = encode(Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 900), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    with pytest.raises(DecodeError, match=r"'depth\.png'.*unsupported mode 'I;16'"):
        decode_image(data, name="depth.png")


def test_bad_arguments_are_config_errors(jpeg_640: bytes) -> None:
    with pytest.raises(ConfigError):
        decode_image(jpeg_640, mode="YCbCr")
    with pytest.raises(ConfigError):
        decode_image(jpeg_640, size=(224, 224))  # a tuple needs resize="exact"
    with pytest.raises(ConfigError):
        decode_image(jpeg_640, size=224, resample="fancy")
    # Argument errors win over data errors: the caller's bug is not a bad sample.
    with pytest.raises(ConfigError):
        decode_image(b"garbage", size=-1)


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("side", [10_000, 60_000])
def test_huge_declared_size_is_refused_before_allocation(side: int) -> None:
    # 10000^2 is above Pillow's limit but below twice it, where Pillow only warns
    # (and would allocate 400 MB); 60000^2 is refused by Pillow itself.
    with pytest.raises(DecodeError, match=r"'bomb\.png'.*too many pixels"):
        decode_image(_png_header_only(side, side), name="bomb.png")


def test_backend_info_describes_pillow() -> None:
    import PIL

    info = backend_info()
    assert info["version"] == PIL.__version__
    assert info["library"] == ("Pillow-SIMD" if ".post" in PIL.__version__ else "Pillow")
    assert info["pillow_simd"] is (".post" in PIL.__version__)
    assert isinstance(info["libjpeg_turbo"], bool)
    assert isinstance(info["cpu_simd"], list)
    json.dumps(info)


def test_optional_dependencies_are_imported_lazily() -> None:
    # A child process in which Pillow and torch cannot be imported: the package
    # imports, and using it says which extra to install.
    code = """
import sys
sys.modules["PIL"] = None
sys.modules["torch"] = None
import numpy as np
import fastload.decode as d
from fastload.errors import MissingDependencyError
for call in (lambda: d.decode_image(b"x"), lambda: d.to_tensor(np.zeros((2, 2, 3), np.uint8))):
    try:
        call()
    except MissingDependencyError as e:
        print(e)
    else:
        raise SystemExit("no MissingDependencyError")
print(d.segmentation_to_mask([[0.0, 0.0, 3.0, 0.0, 3.0, 3.0]], 4, 4, backend="numpy").sum())
"""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "fastload[image]" in lines[0]
    assert "fastload[torch]" in lines[1]
    assert int(lines[2]) > 0
