"""GPU JPEG decoding (fastload.decode.gpu): the device resize against Pillow, the
decoder's outputs against the CPU path's, its errors and fallbacks.

The resize and the error paths run everywhere; decoding needs torchvision's image
extension (extra ``gpu``; the registry's torchvision imports in the suite through the
test shim, but its image extension does not load beside the CPU torch of the test venv,
so those tests skip there, saying so: ``tests/gpu/tv_io.py``); the CUDA tests need a
GPU.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from typing import Any

import numpy as np
import pytest
import torch

from decode.images import encode, photo_like
from fastload.decode import decode_image, output_size, to_tensor
from fastload.decode.gpu import (
    NvjpegDecoder,
    image_extension_problem,
    resize_images,
    torchvision_io,
)
from fastload.errors import ConfigError, DecodeError, MissingDependencyError
from fastload.packed import PackedBytes
from gpu.tv_io import PROBLEM, needs_torchvision_io

# The CPU path's tolerances for a reduced (draft) decode + resize against a full
# decode + resize, from tests/decode/test_image.py; the GPU path decodes in full,
# so it is held to them against the CPU path's output.
TOL_MEAN_PHOTO = 1.0
TOL_MEAN_NOISY = 3.0
TOL_P99 = 12
TOL_MAX = 48
# torch's antialiased bilinear against Pillow's bilinear on the same pixels: measured
# mean <= 0.15, max 1 (rounding) over 6 images x 5 sizes
TOL_RESIZE_MEAN = 0.3
TOL_RESIZE_MAX = 1

SIZES = [(224, "exact"), ((160, 200), "exact"), (224, "shorter"), (100, "longer")]


def _jpeg(seed: int, noise: float = 4.0) -> bytes:
    w, h = (640, 480) if seed % 2 == 0 else (375, 500)
    return encode(photo_like(w, h, seed=seed, noise=noise), "JPEG", quality=90)


def _hwc(t: torch.Tensor) -> np.ndarray:
    return t.cpu().permute(1, 2, 0).numpy().astype(np.int16)


def _within(got: np.ndarray, ref: np.ndarray, mean: float, p99: float, top: float) -> None:
    assert got.shape == ref.shape
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.mean() <= mean
    assert np.percentile(diff, 99) <= p99
    assert diff.max() <= top


# ------------------------------------------------------------------ the resize
@pytest.mark.parametrize("in_float", [True, False], ids=["float-as-on-cuda", "uint8"])
@pytest.mark.parametrize(("size", "resize"), SIZES)
def test_device_resize_follows_pillow_bilinear(size: Any, resize: str, in_float: bool) -> None:
    blobs = [_jpeg(s) for s in range(4)]
    full = [to_tensor(decode_image(b, draft=False)) for b in blobs]
    out = resize_images(full, size, resize, in_float=in_float)
    for i, b in enumerate(blobs):
        ref = np.asarray(decode_image(b, size=size, resize=resize, draft=False))
        _within(_hwc(out[i]), ref, TOL_RESIZE_MEAN, TOL_RESIZE_MAX, TOL_RESIZE_MAX)


def test_exact_resize_stacks_channels_last_and_lists_otherwise() -> None:
    imgs = [torch.randint(0, 255, (3, h, w), dtype=torch.uint8) for h, w in [(40, 60), (50, 50)]]
    stacked = resize_images(imgs, (24, 32), "exact")
    assert isinstance(stacked, torch.Tensor)
    assert stacked.shape == (2, 3, 24, 32)
    assert stacked.dtype == torch.uint8
    assert stacked.is_contiguous(memory_format=torch.channels_last)
    listed = resize_images(imgs, 30, "shorter")
    assert isinstance(listed, list)
    assert [tuple(t.shape) for t in listed] == [(3, 30, 45), (3, 30, 30)]
    for t, img in zip(listed, imgs, strict=True):
        w, h = output_size(img.shape[2], img.shape[1], 30, "shorter")
        assert tuple(t.shape[1:]) == (h, w)
    assert resize_images(imgs, None) == imgs


def test_same_shaped_images_are_resized_together_with_the_same_result() -> None:
    imgs = [torch.randint(0, 255, (3, 48, 64), dtype=torch.uint8) for _ in range(3)]
    together = resize_images(imgs, 20, "exact")
    assert isinstance(together, torch.Tensor)
    for i, img in enumerate(imgs):
        alone = resize_images([img], 20, "exact")
        assert torch.equal(together[i], alone[0])


def test_an_image_already_at_the_size_is_not_resampled() -> None:
    img = torch.randint(0, 255, (3, 20, 30), dtype=torch.uint8)
    assert torch.equal(resize_images([img], (20, 30), "exact")[0], img)


def test_resize_refuses_bad_input() -> None:
    with pytest.raises(ConfigError):
        resize_images([torch.zeros(3, 4, 4)], 2)  # float
    with pytest.raises(ConfigError):
        resize_images([torch.zeros(16, dtype=torch.uint8)], 2)  # still encoded
    with pytest.raises(ConfigError):
        resize_images([torch.zeros(3, 4, 4, dtype=torch.uint8)], (2, 2), "shorter")
    mixed = [torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(1, 4, 4, dtype=torch.uint8)]
    with pytest.raises(ConfigError, match="channels"):
        resize_images(mixed, 2, "exact")


# ------------------------------------------------------- decoder, no torchvision
def test_decoder_settings_are_checked_at_construction() -> None:
    with pytest.raises(ConfigError):
        NvjpegDecoder(size=(224, 224), resize="shorter")
    with pytest.raises(ConfigError):
        NvjpegDecoder(size=0)
    with pytest.raises(ConfigError):
        NvjpegDecoder(resize="fit")
    with pytest.raises(ConfigError):
        NvjpegDecoder(mode="CMYK")
    dec = NvjpegDecoder(224, fields="JPG")
    assert dec.matches("jpg")
    assert dec.matches("left.jpg")
    assert not dec.matches("png")
    assert not dec.matches("__key__")
    assert dec.stacks
    assert not NvjpegDecoder(224, resize="shorter").stacks


def test_a_field_that_holds_no_encoded_images_is_a_config_error() -> None:
    dec = NvjpegDecoder(32, device="cpu")
    with pytest.raises(ConfigError, match="'jpg'"):
        dec({"jpg": torch.zeros(2, 3, 8, 8)})
    with pytest.raises(ConfigError, match="float32"):
        dec({"jpg": [torch.zeros(8)]})
    with pytest.raises(ConfigError, match="int"):
        dec({"jpg": [1, 2]})


def test_a_stacked_batch_needs_every_image() -> None:
    dec = NvjpegDecoder(32, device="cpu")
    batch = {"__key__": ["a", "b"], "jpg": PackedBytes.from_list([b"\xff\xd8", None])}
    with pytest.raises(DecodeError, match="'b'"):
        dec(batch)


def test_cuda_without_a_gpu_is_a_config_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    dec = NvjpegDecoder(32)
    with pytest.raises(ConfigError, match="CUDA"):
        dec({"jpg": [_jpeg(0)]})


def test_without_torchvision_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails as if missing
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(MissingDependencyError, match=r"fastload\[gpu\]"):
        torchvision_io()
    with pytest.raises(MissingDependencyError, match="torchvision"):
        NvjpegDecoder(32, device="cpu")({"jpg": [_jpeg(0)]})


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed"
)
def test_the_probe_tells_the_truth() -> None:
    # where torchvision imports, the probe's verdict is what decode_jpeg really does
    try:
        import torchvision.io
    except Exception as exc:  # built for another torch, outside the test shim
        with pytest.raises(MissingDependencyError, match="torchvision"):
            image_extension_problem()
        pytest.skip(f"torchvision does not import here: {exc!r}")
    data = torch.frombuffer(bytearray(_jpeg(0)), dtype=torch.uint8)
    problem = image_extension_problem()
    if problem is None:
        assert torchvision.io.decode_jpeg(data).shape == (3, 480, 640)
        assert PROBLEM is None
        return
    with pytest.raises(RuntimeError):
        torchvision.io.decode_jpeg(data)
    assert "image extension" in problem
    # the decoder says so, instead of sending every image to Pillow
    dec = NvjpegDecoder(32, device="cpu")
    with pytest.raises(MissingDependencyError, match="image extension does not load") as info:
        dec({"jpg": [_jpeg(0)]})
    assert "fastload[gpu]" in str(info.value)
    assert dec.fallbacks == 0
    with pytest.raises(MissingDependencyError, match="image extension does not load"):
        torchvision_io()


# ---------------------------------------------------------- decoder, decoding
def _decode_cpu_path(blobs: list[bytes], size: Any, resize: str) -> list[np.ndarray]:
    return [np.asarray(decode_image(b, size=size, resize=resize)) for b in blobs]


def _check_against_cpu_path(
    out: Any, blobs: list[bytes], size: Any, resize: str, noise: float
) -> None:
    refs = _decode_cpu_path(blobs, size, resize)
    tol = TOL_MEAN_PHOTO if noise <= 4 else TOL_MEAN_NOISY
    for i, ref in enumerate(refs):
        _within(_hwc(out[i]), ref, tol, TOL_P99, TOL_MAX)


@needs_torchvision_io
@pytest.mark.parametrize(("size", "resize"), SIZES)
@pytest.mark.parametrize("noise", [4.0, 18.0])
def test_cpu_decode_matches_the_cpu_path(size: Any, resize: str, noise: float) -> None:
    blobs = [_jpeg(s, noise) for s in range(4)]
    dec = NvjpegDecoder(size, device="cpu", resize=resize)
    batch = {"jpg": PackedBytes.from_list(blobs), "cls": torch.arange(4)}
    out = dec(batch)
    assert out["cls"] is batch["cls"]
    images = out["jpg"]
    if resize == "exact":
        assert isinstance(images, torch.Tensor)
        assert images.dtype == torch.uint8
        assert images.shape[:2] == (4, 3)
        assert images.is_contiguous(memory_format=torch.channels_last)
    else:
        assert isinstance(images, list)
    _check_against_cpu_path(images, blobs, size, resize, noise)
    assert dec.decoded == 4
    assert dec.fallbacks == 0


@needs_torchvision_io
def test_lists_of_bytes_and_missing_samples() -> None:
    blobs = [_jpeg(0), _jpeg(1)]
    dec = NvjpegDecoder(64, device="cpu", resize="shorter")
    out = dec({"jpeg": [blobs[0], None, memoryview(blobs[1])]})["jpeg"]
    assert out[1] is None
    assert [t.shape[0] for t in (out[0], out[2])] == [3, 3]
    assert min(out[0].shape[1:]) == 64
    kept = NvjpegDecoder(device="cpu")({"jpg": PackedBytes.from_list(blobs)})["jpg"]
    assert [tuple(t.shape) for t in kept] == [(3, 480, 640), (3, 500, 375)]


@needs_torchvision_io
def test_what_nvjpeg_refuses_falls_back_to_pillow_or_is_named() -> None:
    from PIL import Image

    png = encode(photo_like(64, 48, seed=3), "PNG")
    good = _jpeg(0)
    dec = NvjpegDecoder(32, device="cpu")
    out = dec({"__key__": ["k0", "k1"], "jpg": PackedBytes.from_list([good, png])})["jpg"]
    assert out.shape == (2, 3, 32, 32)
    ref = np.asarray(
        Image.open(io.BytesIO(png)).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR)
    )
    _within(_hwc(out[1]), ref, TOL_RESIZE_MEAN, TOL_RESIZE_MAX, TOL_RESIZE_MAX)
    assert dec.fallbacks == 1
    strict = NvjpegDecoder(32, device="cpu", fallback=False)
    with pytest.raises(DecodeError, match="'k1'"):
        strict({"__key__": ["k0", "k1"], "jpg": PackedBytes.from_list([good, png])})
    with pytest.raises(DecodeError, match="'k0'"):
        dec({"__key__": ["k0"], "jpg": PackedBytes.from_list([b"not an image at all"])})


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@needs_torchvision_io
@pytest.mark.parametrize("where", ["cpu", "pinned", "cuda"])
@pytest.mark.parametrize(("size", "resize"), [(224, "exact"), (224, "shorter")])
def test_nvjpeg_on_cuda_matches_the_cpu_path(where: str, size: Any, resize: str) -> None:
    blobs = [_jpeg(s, 18.0) for s in range(6)]
    packed = PackedBytes.from_list(blobs)
    if where == "pinned":
        packed = packed.pin_memory()
    elif where == "cuda":
        packed = packed.to("cuda")
    dec = NvjpegDecoder(size, device="cuda", resize=resize)
    images = dec({"jpg": packed})["jpg"]
    first = images[0]
    assert first.is_cuda
    if resize == "exact":
        assert images.shape == (6, 3, 224, 224)
        assert images.is_contiguous(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    _check_against_cpu_path(images, blobs, size, resize, 18.0)
    assert dec.fallbacks == 0
