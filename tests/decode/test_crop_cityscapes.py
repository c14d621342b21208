"""Random patches of Cityscapes frames with their label images cut the same way: a
converted Cityscapes dataset read by ``ShardedDataset`` with a ``CropDecoder`` gives,
for each sample, the drop-in's image and semantic and instance targets cut to the
drawn box (the route docs/howto-crops.md gives for Cityscapes crops)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import convert
from fastload.convert.synthetic import make_cityscapes
from fastload.decode import CropDecoder, FixedCrop, RandomPatch
from fastload.errors import ConfigError


def test_cityscapes_patches_cut_image_and_labels_alike(tmp_path: Path) -> None:
    root = make_cityscapes(tmp_path / "src", split="val", cities=2, per_city=3, size=(96, 48))
    url = str(tmp_path / "ds")
    convert.cityscapes(root, url, split="val", shard_size="30KB", progress=False)
    full = fastload.Cityscapes(url, split="val", target_type=["semantic", "instance", "color"])
    for crop in (RandomPatch(40, 24), FixedCrop(8, 4, 64, 32)):
        ds = fastload.ShardedDataset(url, decode=CropDecoder(crop, image="numpy", seed=4))
        boxes = set()
        for i in range(len(ds)):
            out = ds[i]
            image, (semantic, instance, color) = full[i]
            left, top, w, h = out["__crop__"]
            boxes.add(out["__crop__"])
            cut = (slice(top, top + h), slice(left, left + w))
            np.testing.assert_array_equal(out["leftImg8bit.png"], np.asarray(image)[cut])
            np.testing.assert_array_equal(out["gtFine_labelIds.png"], np.asarray(semantic)[cut])
            ids = np.asarray(instance).astype(np.int64)[cut]
            np.testing.assert_array_equal(out["gtFine_instanceIds.png"], ids)
            np.testing.assert_array_equal(out["gtFine_color.png"], np.asarray(color)[cut])
            assert out["leftImg8bit.png"].shape == (h, w, 3)
        if isinstance(crop, RandomPatch):
            assert len(boxes) > 1  # drawn per sample
        ds.close()
    full.close()


def test_the_dropin_crop_option(tmp_path: Path) -> None:
    root = make_cityscapes(tmp_path / "src", split="val", cities=2, per_city=3, size=(96, 48))
    url = str(tmp_path / "ds")
    convert.cityscapes(root, url, split="val", shard_size="30KB", progress=False)
    types = ["semantic", "instance", "color"]
    full = fastload.Cityscapes(url, split="val", target_type=types)
    patch = RandomPatch(40, 24)

    def boxes_of(epoch: int) -> list[tuple[int, int, int, int]]:
        draw = CropDecoder(patch, seed=9, epoch=epoch)
        out = []
        for i in range(len(full)):
            width, height = full[i][0].size
            out.append(patch.box(width, height, draw.rng(full.source.read(i)["__key__"])))
        return out

    plain = fastload.Cityscapes(url, split="val", target_type=types, crop=patch, seed=9)
    tiered = fastload.Cityscapes(
        url,
        split="val",
        target_type=types,
        crop=patch,
        seed=9,
        cache_dir=tmp_path / "cache",
        pixel_cache=True,
    )
    for epoch in (0, 1):
        if epoch:
            plain.set_epoch(epoch)
            tiered.set_epoch(epoch)
        boxes = boxes_of(epoch)
        assert len(set(boxes)) > 1
        for ds in (plain, tiered):
            for i, (left, top, w, h) in enumerate(boxes):
                image, targets = ds[i]
                want_image, want_targets = full[i]
                ltrb = (left, top, left + w, top + h)
                assert (image.mode, image.size) == ("RGB", (w, h))
                np.testing.assert_array_equal(np.asarray(image), np.asarray(want_image.crop(ltrb)))
                for got, want in zip(targets, want_targets, strict=True):
                    assert got.mode == want.mode
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.crop(ltrb)))
    assert boxes_of(0) != boxes_of(1)
    # through persistent workers, the epoch set on the dataset reaches them
    loader = torch.utils.data.DataLoader(
        plain, batch_size=2, num_workers=2, persistent_workers=True, collate_fn=list
    )
    for epoch in (2, 3):
        plain.set_epoch(epoch)
        got = [item for b in loader for item in b]
        for i, ((image, _), (left, top, w, h)) in enumerate(zip(got, boxes_of(epoch), strict=True)):
            want = full[i][0].crop((left, top, left + w, top + h))
            np.testing.assert_array_equal(np.asarray(image), np.asarray(want))
    del loader
    with pytest.raises(ConfigError, match="polygon targets"):
        fastload.Cityscapes(url, split="val", target_type="polygon", crop=patch)
    with pytest.raises(ConfigError, match="RandomPatch or FixedCrop"):
        fastload.Cityscapes(url, split="val", crop="random")  # type: ignore[arg-type]
    for ds in (plain, tiered, full):
        ds.close()
