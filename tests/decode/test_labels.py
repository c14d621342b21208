"""Label images: pixel-exact with ``Image.open``, modes kept, NEAREST resize, dtypes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastload.decode import decode_image, decode_label, label_to_numpy, label_to_tensor
from fastload.errors import DecodeError

from .images import encode


def _label_ids(seed: int = 0, width: int = 256, height: int = 128) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Blocky regions of Cityscapes label ids (0..33), as real label maps look.
    blocks = rng.integers(0, 34, size=(height // 8, width // 8), dtype=np.uint8)
    return np.kron(blocks, np.ones((8, 8), dtype=np.uint8))


def _instance_ids(seed: int = 0, width: int = 256, height: int = 128) -> np.ndarray:
    classes = _label_ids(seed, width, height).astype(np.uint16)
    rng = np.random.default_rng(seed + 1)
    instance = rng.integers(0, 12, size=classes.shape).astype(np.uint16)
    # Cityscapes: id < 1000 for stuff, class * 1000 + instance for things (26001, ...).
    return np.where(classes >= 24, classes * 1000 + instance, classes).astype(np.uint16)


@pytest.fixture
def label_pngs() -> dict[str, bytes]:
    color = np.zeros((128, 256, 4), dtype=np.uint8)
    color[..., :3] = (
        np.random.default_rng(2).integers(0, 256, (16, 32, 3)).repeat(8, 0).repeat(8, 1)
    )
    color[..., 3] = 255
    return {
        "labelIds": encode(_label_ids(), "PNG"),
        "instanceIds": encode(_instance_ids(), "PNG"),
        "color": encode(Image.fromarray(color, "RGBA"), "PNG"),
    }


@pytest.mark.parametrize(
    ("kind", "mode"), [("labelIds", "L"), ("instanceIds", "I;16"), ("color", "RGBA")]
)
def test_label_is_exactly_image_open(label_pngs: dict[str, bytes], kind: str, mode: str) -> None:
    data = label_pngs[kind]
    ref = Image.open(io.BytesIO(data))
    ref.load()
    img = decode_label(data)
    assert img.mode == ref.mode == mode
    assert img.size == ref.size
    assert img.tobytes() == ref.tobytes()
    assert np.array_equal(label_to_numpy(img), np.asarray(ref))


def test_instance_ids_keep_values_above_255(label_pngs: dict[str, bytes]) -> None:
    arr = label_to_numpy(decode_label(label_pngs["instanceIds"]))
    assert arr.dtype == np.int64
    assert arr.shape == (128, 256)
    assert np.array_equal(arr, _instance_ids().astype(np.int64))
    assert arr.max() > 255
    assert (arr // 1000 >= 24).any()
    tensor = label_to_tensor(decode_label(label_pngs["instanceIds"]))
    assert str(tensor.dtype) == "torch.int64"
    assert int(tensor.max()) == int(arr.max())


def test_32bit_instance_image_keeps_values() -> None:
    values = np.array([[26001, 70000], [0, 2**31 - 1]], dtype=np.int32)
    buf = io.BytesIO()
    Image.fromarray(values, "I").save(buf, "TIFF")
    img = decode_label(buf.getvalue())
    assert img.mode == "I"
    assert np.array_equal(label_to_numpy(img), values.astype(np.int64))


def test_label_dtypes(label_pngs: dict[str, bytes]) -> None:
    ids = label_to_numpy(decode_label(label_pngs["labelIds"]))
    assert ids.dtype == np.uint8
    assert ids.shape == (128, 256)
    color = label_to_numpy(decode_label(label_pngs["color"]))
    assert color.dtype == np.uint8
    assert color.shape == (128, 256, 4)
    assert label_to_numpy(decode_label(label_pngs["labelIds"])).flags.writeable


def _values(arr: np.ndarray) -> set[tuple[int, ...]]:
    """The distinct pixel values (scalars or colour tuples) of a label array."""
    pixels = arr.reshape(arr.shape[0] * arr.shape[1], -1)
    return {tuple(int(v) for v in p) for p in np.unique(pixels, axis=0)}


@pytest.mark.parametrize("kind", ["labelIds", "instanceIds", "color"])
def test_label_resize_is_nearest(label_pngs: dict[str, bytes], kind: str) -> None:
    data = label_pngs[kind]
    img = decode_label(data, size=64)  # 256x128 -> 128x64, shorter side 64
    assert img.size == (128, 64)
    ref = Image.open(io.BytesIO(data))
    expected = ref.resize((128, 64), Image.Resampling.NEAREST)
    assert img.mode == ref.mode
    assert img.tobytes() == expected.tobytes()
    # No blended values: every output value occurs in the input.
    assert _values(label_to_numpy(img)) <= _values(label_to_numpy(ref))


def test_label_and_image_get_the_same_size(label_pngs: dict[str, bytes]) -> None:
    photo = encode(np.zeros((128, 256, 3), dtype=np.uint8), "PNG")
    cases: list[tuple[int | tuple[int, int], str]] = [
        (100, "shorter"),
        (100, "longer"),
        ((50, 70), "exact"),
    ]
    for size, resize in cases:
        assert (
            decode_label(label_pngs["labelIds"], size=size, resize=resize).size
            == decode_image(photo, size=size, resize=resize).size
        )


def test_bad_label_names_the_sample() -> None:
    with pytest.raises(DecodeError, match=r"label image 'aachen_000000_000019\.gtFine_labelIds"):
        decode_label(b"\x89PNG\r\n\x1a\nnope", name="aachen_000000_000019.gtFine_labelIds.png")
