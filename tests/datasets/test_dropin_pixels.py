"""The decoded-pixel tier under the torchvision drop-ins: ``CocoDetection``,
``Cityscapes`` and ``ImageFolder`` with ``pixel_cache=True`` give, for every index of
two epochs, through 0 and 2 DataLoader workers, items equal to the same drop-in
without it (images: mode, size and pixels; targets as values), with the shards on
SeaweedFS; the second epoch reads the pixels with no decode. The folder holds the
image kinds whose RGB conversion could differ: grayscale, CMYK, palette with
transparency, EXIF-rotated, PNG with alpha."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import convert
from fastload.convert.synthetic import make_cityscapes, make_coco, make_folder

pytestmark = pytest.mark.s3


def same(a: Any, b: Any, where: str = "item") -> None:
    """``a`` equals ``b`` in type and value (PIL images: mode, size and pixels)."""
    if isinstance(b, Image.Image):
        assert isinstance(a, Image.Image), where
        assert (a.mode, a.size) == (b.mode, b.size), where
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
    elif isinstance(b, dict):
        assert type(a) is dict, where
        assert sorted(a) == sorted(b), where
        for k in b:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b), where
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b), where
        assert a == b, where


def _items(ds: Any, num_workers: int) -> list[Any]:
    loader: Any = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=num_workers, collate_fn=list
    )
    return [item for batch in loader for item in batch]


def _check(make: Any, tmp_path: Path, num_workers: int) -> None:
    plain = make()
    want = [plain[i] for i in range(len(plain))]
    ds = make(cache_dir=tmp_path / "cache", pixel_cache=True)
    assert ds.pixels is not None
    assert not ds.batch_transport
    for epoch in range(2):
        got = _items(ds, num_workers)
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"epoch {epoch} item {i}")
    ds.close()
    # the tier holds them: a fresh dataset reads every item with no decode
    fresh = make(cache_dir=tmp_path / "cache", pixel_cache=True)
    again = [fresh[i] for i in range(len(fresh))]
    assert fresh.pixels.stats["hits"] == len(fresh)
    assert fresh.pixels.stats["decoded"] == 0
    for i, (a, b) in enumerate(zip(again, want, strict=True)):
        same(a, b, f"item {i}")
    fresh.close()
    plain.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_coco_with_the_pixel_tier(
    seaweed: Any, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, num_workers: int
) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=10, size=(64, 48), seed=3)
    url = seaweed.new_url("coco-px")
    opts = seaweed.storage_options
    convert.coco(images, ann, url, shard_size="16KB", storage_options=opts, progress=False)

    def make(**kw: Any) -> Any:
        return fastload.CocoDetection(url, storage_options=opts, **kw)

    _check(make, tmp_path, num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cityscapes_with_the_pixel_tier(seaweed: Any, tmp_path: Path, num_workers: int) -> None:
    root = make_cityscapes(tmp_path / "src", split="val", cities=2, per_city=3, size=(64, 32))
    url = seaweed.new_url("cityscapes-px")
    opts = seaweed.storage_options
    convert.cityscapes(
        root, url, split="val", shard_size="30KB", storage_options=opts, progress=False
    )
    for target_type in (["semantic", "instance", "color", "polygon"], "semantic"):

        def make(target_type: Any = target_type, **kw: Any) -> Any:
            return fastload.Cityscapes(
                url, split="val", target_type=target_type, storage_options=opts, **kw
            )

        _check(make, tmp_path / str(len(target_type)), num_workers)


def _odd_images(folder: Path) -> None:
    """Images whose conversion to RGB takes other paths than a plain RGB JPEG's."""
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)

    def save(img: Image.Image, name: str, **kw: Any) -> None:
        img.save(folder / name, **kw)

    save(Image.fromarray(rgb[:, :, 0], "L"), "gray.jpg", quality=90)
    save(Image.fromarray(rgb).convert("CMYK"), "cmyk.jpg", quality=90)
    pal = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    save(pal, "palette_transparent.png", transparency=3)
    save(Image.fromarray(np.dstack([rgb, rgb[:, :, :1]]), "RGBA"), "alpha.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: torchvision's loader does not transpose, nor do we
    save(Image.fromarray(rgb), "rotated.jpg", exif=exif, quality=90)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_folder_with_the_pixel_tier(seaweed: Any, tmp_path: Path, num_workers: int) -> None:
    root = make_folder(tmp_path / "src", classes=3, per_class=3, seed=2, size=(40, 30))
    first = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))[0]
    _odd_images(Path(root) / first)
    url = seaweed.new_url("folder-px")
    opts = seaweed.storage_options
    convert.folder(root, url, shard_size="12KB", storage_options=opts, progress=False)

    def make(**kw: Any) -> Any:
        return fastload.ImageFolder(url, storage_options=opts, **kw)

    plain = make()
    modes = {Image.open(io.BytesIO(bytes(plain.source.read(i)[k]))).mode
             for i in range(len(plain)) for k in plain.source.read(i)
             if k not in ("cls", "__key__")}  # fmt: skip
    assert {"L", "CMYK", "P", "RGBA", "RGB"} <= modes
    plain.close()
    _check(make, tmp_path, num_workers)


def test_max_side_bounds_the_dropin_images(seaweed: Any, tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=4, size=(96, 80), seed=1)
    url = seaweed.new_url("coco-side")
    opts = seaweed.storage_options
    convert.coco(images, ann, url, storage_options=opts, progress=False)
    ds = fastload.CocoDetection(
        url,
        storage_options=opts,
        cache_dir=tmp_path / "cache",
        pixel_cache=fastload.PixelCache(max_side=32),
    )
    plain = fastload.CocoDetection(url, storage_options=opts)
    for i in range(len(ds)):
        (img, target), (full, want) = ds[i], plain[i]
        assert max(img.size) == min(32, max(full.size))
        same(target, want)
    ds.close()
    plain.close()
