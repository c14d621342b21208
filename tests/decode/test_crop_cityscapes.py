"""Random patches of Cityscapes frames with their label images cut the same way: a
converted Cityscapes dataset read by ``ShardedDataset`` with a ``CropDecoder`` gives,
for each sample, the drop-in's image and semantic and instance targets cut to the
drawn box (the route docs/howto-crops.md gives for Cityscapes crops)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import fastload
from fastload import convert
from fastload.convert.synthetic import make_cityscapes
from fastload.decode import CropDecoder, FixedCrop, RandomPatch


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
