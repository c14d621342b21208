"""Attacks with image bytes: a PostScript file named ``.jpg`` (handed to Ghostscript by
Pillow's EPS plugin when it is installed) and a small PNG that decodes to 169 million
pixels. Every path that decodes (datasets, converters, labels) goes through one entry
point with an explicit format list and pixel cap."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import pytest

from fastload.config import MAX_IMAGE_PIXELS
from fastload.convert import SourceDataError
from fastload.convert._common import image_format
from fastload.decode.image import decode_image
from fastload.decode.labels import decode_label
from fastload.errors import DecodeError
from fastload.shards.writer import ShardWriter

EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n%%EndComments\n"
    b"newpath 0 0 moveto 16 16 lineto stroke showpage\n%%EOF\n"
)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 13000, height: int = 13000) -> bytes:
    """A valid 1-bit grayscale PNG of ``width`` x ``height`` zeros: tiny on disk,
    ``width * height`` bytes once Pillow decodes it."""
    row = b"\0" * (1 + (width + 7) // 8)
    z = zlib.compressobj(9)
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = png_bomb()
    assert len(data) < 200_000
    assert MAX_IMAGE_PIXELS < 13000 * 13000
    return data


def _coco_dataset(root: Path, image: bytes, ext: str) -> str:
    url = str(root / "coco")
    source = {"kind": "coco", "categories": [], "image_ids": [1]}
    with ShardWriter(url, source=source) as w:
        w.write(
            {
                "__key__": "000000000001",
                ext: image,
                "json": {"image": {"id": 1, "file_name": f"1.{ext}"}, "annotations": []},
            }
        )
    return url


def _cityscapes_dataset(root: Path, image: bytes, label: bytes) -> str:
    url = str(root / "cityscapes")
    source = {"kind": "cityscapes", "split": "train", "mode": "fine"}
    with ShardWriter(url, source=source) as w:
        w.write(
            {
                "__key__": "aachen_000000_000019",
                "leftImg8bit.png": image,
                "gtFine_instanceIds.png": label,
            }
        )
    return url


def _small_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_postscript_named_jpg_is_not_identified_by_the_converter() -> None:
    # Pillow without formats= identifies it as EPS (and would run Ghostscript on load).
    with pytest.raises(SourceDataError, match="not an image Pillow can identify"):
        image_format(EPS, "evil.jpg", verify=False)
    with pytest.raises(SourceDataError, match="not an image Pillow can identify"):
        image_format(EPS, "evil.jpg", verify=True)


def test_postscript_in_a_coco_dataset_is_a_decode_error(tmp_path: Path) -> None:
    from fastload.datasets.coco import CocoDetection

    ds = CocoDetection(_coco_dataset(tmp_path, EPS, "jpg"))
    with pytest.raises(DecodeError, match="'000000000001'.*not an image"):
        ds[0]


def test_postscript_in_a_cityscapes_dataset_is_a_decode_error(tmp_path: Path) -> None:
    from fastload.datasets.cityscapes import Cityscapes

    ds = Cityscapes(_cityscapes_dataset(tmp_path, EPS, _small_png()))
    with pytest.raises(DecodeError, match="not an image"):
        ds[0]
    ds = Cityscapes(_cityscapes_dataset(tmp_path / "b", _small_png(), EPS))
    with pytest.raises(DecodeError, match="not an image"):
        ds[0]


# Pillow warns on the header before fastload refuses it: the warning is expected.
quiet_pillow = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")


@quiet_pillow
def test_pixel_bomb_is_refused_from_its_header_on_every_path(bomb: bytes, tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match="too many pixels.*13000x13000"):
        decode_label(bomb, name="gtFine_labelIds.png")
    with pytest.raises(DecodeError, match="too many pixels"):
        decode_image(bomb, name="x.png")
    with pytest.raises(SourceDataError, match="image refused.*too many pixels"):
        image_format(bomb, "bomb.png", verify=False)

    from fastload.datasets.cityscapes import Cityscapes
    from fastload.datasets.coco import CocoDetection

    with pytest.raises(DecodeError, match="'000000000001'.*too many pixels"):
        CocoDetection(_coco_dataset(tmp_path, bomb, "png"))[0]
    with pytest.raises(DecodeError, match="'aachen_000000_000019'.*too many pixels"):
        Cityscapes(_cityscapes_dataset(tmp_path, _small_png(), bomb), target_type="instance")[0]


@quiet_pillow
def test_pixel_bomb_in_a_coco_conversion_is_bad_input(bomb: bytes, tmp_path: Path) -> None:
    from fastload import convert

    images = tmp_path / "images"
    images.mkdir()
    (images / "1.png").write_bytes(bomb)
    ann = tmp_path / "instances.json"
    ann.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "1.png", "width": 13000, "height": 13000}],
                "annotations": [],
                "categories": [],
            }
        )
    )
    with pytest.raises(SourceDataError, match="too many pixels") as info:
        convert.coco(images, ann, str(tmp_path / "out"), progress=False, workers=1)
    assert info.value.path == str(images / "1.png")


def test_images_under_the_cap_still_decode() -> None:
    img = decode_image(_small_png(), size=4, resize="exact")
    assert img.size == (4, 4)
    assert decode_label(_small_png()).size == (8, 8)
