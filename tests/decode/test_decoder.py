"""``Decoder``: dispatch by field, COCO/Cityscapes-shaped samples, pickling into workers."""

from __future__ import annotations

import io
import json
import pickle
from typing import Any, cast

import numpy as np
import pytest
from PIL import Image

from fastload.decode import Decoder, decode_image
from fastload.errors import ConfigError, DecodeError

from .images import encode, photo_like

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _coco_sample(jpeg: bytes) -> dict[str, Any]:
    annotations = [
        {
            "id": 1,
            "image_id": 42,
            "category_id": 18,
            "segmentation": [[100.0, 100.0, 300.0, 100.0, 300.0, 260.0, 100.0, 260.0]],
            "area": 32000.0,
            "bbox": [100.0, 100.0, 200.0, 160.0],
            "iscrowd": 0,
        },
        {
            "id": 2,
            "image_id": 42,
            "category_id": 1,
            "segmentation": {"size": [480, 640], "counts": [480 * 10, 480 * 5, 480 * 625]},
            "area": 2400.0,
            "bbox": [10.0, 0.0, 5.0, 480.0],
            "iscrowd": 1,
        },
    ]
    doc = {
        "image": {"id": 42, "file_name": "000000000042.jpg", "height": 480, "width": 640},
        "annotations": annotations,
    }
    # Values as a ShardReader gives them: memoryviews into a larger buffer.
    backing = bytearray(jpeg + json.dumps(doc).encode())
    view = memoryview(backing)
    return {"__key__": "000000000042", "jpg": view[: len(jpeg)], "json": view[len(jpeg) :]}


def _cityscapes_sample() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ids = np.kron(rng.integers(0, 34, (16, 32), dtype=np.uint8), np.ones((8, 8), np.uint8))
    inst = np.where(ids >= 24, ids.astype(np.uint16) * 1000 + 3, ids).astype(np.uint16)
    color = np.dstack([ids * 7, ids * 3, ids, np.full_like(ids, 255)])
    return {
        "__key__": "aachen_000000_000019",
        "leftImg8bit.png": encode(photo_like(256, 128, seed=1), "PNG"),
        "gtFine_labelIds.png": encode(ids, "PNG"),
        "gtFine_instanceIds.png": encode(inst, "PNG"),
        "gtFine_color.png": encode(Image.fromarray(color, "RGBA"), "PNG"),
        "gtFine_polygons.json": json.dumps({"imgHeight": 128, "imgWidth": 256, "objects": []}),
    }


def test_kind_by_field_name() -> None:
    d = Decoder()
    assert d.kind("jpg") == "image"
    assert d.kind("JPEG") == "image"
    assert d.kind("leftImg8bit.png") == "image"
    assert d.kind("gtFine_labelIds.png") == "label"
    assert d.kind("gtFine_instanceIds.png") == "label"
    assert d.kind("gtFine_color.png") == "label"
    assert d.kind("seg.png") == "label"
    assert d.kind("json") == "json"
    assert d.kind("gtFine_polygons.json") == "json"
    assert d.kind("cls") == "cls"
    assert d.kind("txt") == "txt"
    assert d.kind("npy") == "bytes"


def test_coco_sample_raw_targets(jpeg_640: bytes) -> None:
    sample = _coco_sample(jpeg_640)
    out = Decoder()(sample)
    assert out["__key__"] == "000000000042"
    assert isinstance(out["jpg"], Image.Image)
    assert out["jpg"].size == (640, 480)
    assert out["jpg"].mode == "RGB"
    assert out["json"]["image"]["id"] == 42
    assert len(out["json"]["annotations"]) == 2
    assert "target" not in out


def test_coco_sample_tensor_targets_scaled(jpeg_640: bytes) -> None:
    sample = _coco_sample(jpeg_640)
    out = Decoder(image="tensor", size=224, targets="tensor", masks=True)(sample)
    image = out["jpg"]
    assert tuple(image.shape) == (3, 224, 298)
    expected = np.asarray(decode_image(jpeg_640, size=224)).astype(np.int16)
    # resized by torch's antialiased kernel (resizer="auto"): within one level of Pillow
    diff = np.abs(image.permute(1, 2, 0).numpy().astype(np.int16) - expected)
    assert diff.max() <= 1
    pil = Decoder(image="tensor", size=224, resizer="pil")(sample)["jpg"]
    assert np.array_equal(pil.permute(1, 2, 0).numpy(), expected)
    target = out["target"]
    sx, sy = 298 / 640, 224 / 480
    assert target["boxes"][0].tolist() == pytest.approx([100 * sx, 100 * sy, 300 * sx, 260 * sy])
    assert target["labels"].tolist() == [18, 1]
    assert target["iscrowd"].tolist() == [0, 1]
    assert target["image_id"] == 42
    masks = target["masks"].numpy()
    assert masks.shape == (2, 224, 298)
    # The crowd RLE covers columns 10..14 of 640: about 2.3 columns at 298 wide.
    assert masks[1].any(axis=0).sum() in (2, 3)
    assert masks[1][:, 0].sum() == 0
    # The json is still there, parsed.
    assert out["json"]["image"]["width"] == 640


def test_tensor_targets_without_image_use_json_size(jpeg_640: bytes) -> None:
    sample = _coco_sample(jpeg_640)
    out = Decoder(image=None, targets="tensor")(sample)
    assert isinstance(out["jpg"], bytes)
    assert out["jpg"] == jpeg_640
    assert out["target"]["boxes"][0].tolist() == pytest.approx([100, 100, 300, 260])


def test_cityscapes_sample_pil() -> None:
    sample = _cityscapes_sample()
    out = Decoder()(sample)
    assert out["leftImg8bit.png"].mode == "RGB"
    for field, mode in [
        ("gtFine_labelIds.png", "L"),
        ("gtFine_instanceIds.png", "I;16"),
        ("gtFine_color.png", "RGBA"),
    ]:
        ref = Image.open(io.BytesIO(sample[field]))
        assert out[field].mode == ref.mode == mode
        assert out[field].tobytes() == ref.tobytes()
    assert out["gtFine_polygons.json"]["imgWidth"] == 256


def test_cityscapes_sample_numpy_resized() -> None:
    sample = _cityscapes_sample()
    out = Decoder(image="numpy", size=64)(sample)
    assert out["leftImg8bit.png"].shape == (64, 128, 3)
    assert out["gtFine_labelIds.png"].shape == (64, 128)
    assert out["gtFine_labelIds.png"].dtype == np.uint8
    inst = out["gtFine_instanceIds.png"]
    assert inst.dtype == np.int64
    assert inst.max() > 255
    ref = Image.open(io.BytesIO(sample["gtFine_labelIds.png"])).resize(
        (128, 64), Image.Resampling.NEAREST
    )
    assert np.array_equal(out["gtFine_labelIds.png"], np.asarray(ref))
    assert out["gtFine_color.png"].shape == (64, 128, 4)


def test_cityscapes_sample_tensor_labels() -> None:
    out = Decoder(image="tensor")(_cityscapes_sample())
    assert tuple(out["leftImg8bit.png"].shape) == (3, 128, 256)
    assert str(out["gtFine_instanceIds.png"].dtype) == "torch.int64"
    assert str(out["gtFine_labelIds.png"].dtype) == "torch.uint8"


def test_small_fields_and_unknown_bytes() -> None:
    raw = bytearray(b"\x00\x01binary")
    out = Decoder()(
        {"__key__": "k", "cls": b" 7\n", "txt": "héllo".encode(), "npy": memoryview(raw)}
    )
    assert out["cls"] == 7
    assert out["txt"] == "héllo"
    assert out["npy"] == b"\x00\x01binary"
    assert isinstance(out["npy"], bytes)  # not a view into a shard that may be unmapped


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("json", b"{not json", r"'k1\.json'.*malformed JSON at line 1"),
        ("cls", b"seven", r"'k1\.cls': a class must be an integer"),
        ("txt", b"\xff\xfe\xfa", r"'k1\.txt': not UTF-8 text at byte 0"),
        ("jpg", b"\xff\xd8\xff garbage", r"'k1\.jpg'"),
        ("seg.png", b"\x89PNG\r\n\x1a\n", r"'k1\.seg\.png'"),
    ],
)
def test_errors_name_key_and_field(field: str, value: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        Decoder()({"__key__": "k1", field: value})


def test_tensor_targets_need_a_size() -> None:
    doc = {"annotations": [{"bbox": [0, 0, 1, 1], "category_id": 1}]}
    with pytest.raises(DecodeError, match="image size"):
        Decoder(targets="tensor")({"__key__": "k", "json": json.dumps(doc).encode()})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"image": "cv2"},
        {"targets": "coco"},
        {"resize": "fit"},
        {"size": (224, 224)},  # needs resize="exact"
        {"size": 0},
        {"box_format": "cxcywh"},
        {"mask_backend": "opencv"},
        {"layout": "NCHW"},
    ],
)
def test_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Decoder(**kwargs)


def test_pickle_round_trip(jpeg_640: bytes) -> None:
    d = Decoder(image="numpy", size=(200, 100), resize="exact", label_map={1: 1, 18: 2})
    clone = pickle.loads(pickle.dumps(d))
    assert clone == d
    sample = _coco_sample(jpeg_640)
    a, b = d(sample), clone(sample)
    assert np.array_equal(a["jpg"], b["jpg"])
    assert a["jpg"].shape == (200, 100, 3)


class _Samples:
    """A map-style dataset of encoded samples decoded in the worker."""

    def __init__(self, samples: list[dict[str, Any]], decoder: Decoder) -> None:
        self.samples = samples
        self.decoder = decoder

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.decoder(self.samples[i])["jpg"]


@pytest.mark.slow
def test_decoder_in_spawned_dataloader_workers() -> None:
    import torch

    samples = [
        {"__key__": f"{i:03d}", "jpg": encode(photo_like(128, 96, seed=i), "JPEG", quality=90)}
        for i in range(4)
    ]
    decoder = Decoder(image="tensor", size=(32, 48), resize="exact")
    loader: Any = torch.utils.data.DataLoader(
        cast(Any, _Samples(samples, decoder)),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="spawn",  # the Decoder must pickle into the worker
    )
    batches = list(loader)
    assert [tuple(b.shape) for b in batches] == [(2, 3, 32, 48), (2, 3, 32, 48)]
    expected = torch.stack([decoder(s)["jpg"] for s in samples])
    assert torch.equal(torch.cat(batches), expected)
