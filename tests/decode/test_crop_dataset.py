"""Crops chosen before decoding, through the datasets: ``CropDecoder`` as
``decode=`` of ``ShardedDataset``/``StreamingDataset``, its masks cut with its image,
its draws deterministic per (seed, epoch, key) and torchvision's semantics."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import fastload
from fastload import ShardedDataset, StreamingDataset
from fastload.decode import (
    CropDecoder,
    FixedCrop,
    RandomPatch,
    RandomResizedCrop,
    decode_crop,
)
from fastload.errors import ConfigError
from fastload.shards.writer import ShardWriter

from .images import encode, photo_like

SIZES = [(640, 400), (333, 517), (1200, 300)]  # (width, height)


def _mask(width: int, height: int) -> np.ndarray:
    """A label image whose every pixel says where it is: (x // 4 + y // 4 * 7) % 256."""
    y, x = np.mgrid[0:height, 0:width]
    return ((x // 4 + (y // 4) * 7) % 256).astype(np.uint8)


def _write(url: str, n: int = 12, storage_options: dict[str, Any] | None = None) -> list[Any]:
    samples = []
    with ShardWriter(url, shard_size="300KB", storage_options=storage_options) as w:
        for i in range(n):
            width, height = SIZES[i % len(SIZES)]
            sample = {
                "__key__": f"img{i:04d}",
                "jpg": encode(photo_like(width, height, seed=i), "JPEG", quality=90),
                "seg.png": encode(_mask(width, height), "PNG"),
                "cls": i % 3,
            }
            w.write(sample)
            samples.append(sample)
    return samples


def _check(out: dict[str, Any], raw: dict[str, Any], dec: CropDecoder) -> None:
    box = out["__crop__"]
    want = decode_crop(raw["jpg"], box, size=dec.size)
    np.testing.assert_array_equal(out["jpg"].permute(1, 2, 0).numpy(), want)
    assert out["cls"] == int(raw["cls"])
    left, top, w, h = box
    mask = Image.fromarray(_mask(*SIZES[int(raw["__key__"][3:]) % len(SIZES)]))
    cut = mask.crop((left, top, left + w, top + h))
    if dec.size is not None:
        cut = cut.resize((dec.size[1], dec.size[0]), Image.Resampling.NEAREST)
    np.testing.assert_array_equal(out["seg.png"].numpy(), np.asarray(cut))


def test_random_resized_crop_follows_torchvision() -> None:
    rrc = RandomResizedCrop()
    rng = np.random.default_rng(0)
    for width, height in [(640, 480), (100, 1000), (4096, 4096), (7, 5)]:
        for _ in range(200):
            left, top, w, h = rrc.box(width, height, rng)
            assert left >= 0
            assert left + w <= width
            assert top >= 0
            assert top + h <= height
            if (w, h) != (width, height) and w * h >= 0.08 * width * height * 0.9:
                assert 3 / 4 - 0.1 <= w / h <= 4 / 3 + 0.1 or min(w, h) < 20
    # the fallback (no attempt fits: scale > 1) is torchvision's central crop, exactly
    for width, height in [(640, 480), (100, 1000), (1000, 100), (37, 23)]:
        img = torch.zeros(1, height, width)
        for ratio in [(3 / 4, 4 / 3), (1.0, 1.0), (0.2, 0.3)]:
            top, left, h, w = T.RandomResizedCrop.get_params(img, [2.0, 2.0], list(ratio))
            got = RandomResizedCrop(scale=(2.0, 2.0), ratio=ratio).box(width, height, rng)
            assert got == (left, top, w, h)
    # the area fraction and the log-ratio are drawn like torchvision's: their means agree
    fractions = [math.prod(rrc.box(400, 400, rng)[2:]) / 400**2 for _ in range(2000)]
    torch.manual_seed(0)
    img = torch.zeros(1, 400, 400)
    params = [T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(2000)]
    tv = [h * w / 400**2 for _, _, h, w in params]
    assert abs(np.mean(fractions) - np.mean(tv)) < 0.02


def test_crop_decoder_through_sharded_dataset(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    raw = _write(url)
    dec = CropDecoder(RandomResizedCrop(), size=(96, 128), seed=5)
    ds = ShardedDataset(url, decode=dec)
    first = [ds[i] for i in range(len(ds))]
    for out, sample in zip(first, raw, strict=False):
        assert out["jpg"].shape == (3, 96, 128)
        assert out["seg.png"].shape == (96, 128)
        _check(out, sample, dec)
    # deterministic in (seed, epoch, key): a fresh dataset draws the same crops ...
    again = ShardedDataset(url, decode=pickle.loads(pickle.dumps(dec)))
    assert [again[i]["__crop__"] for i in range(len(ds))] == [o["__crop__"] for o in first]
    # ... and another epoch other ones
    dec.set_epoch(1)
    second = [ds[i]["__crop__"] for i in range(len(ds))]
    assert second != [o["__crop__"] for o in first]
    ds.close()
    again.close()


def test_random_patches_and_fixed_tiles_keep_masks_aligned(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    raw = _write(url, n=6)
    for crop in (RandomPatch(128, 96), FixedCrop(16, 8, 200, 100)):
        dec = CropDecoder(crop, image="tensor", seed=1)
        ds = ShardedDataset(url, decode=dec)
        for i, sample in enumerate(raw):
            out = ds[i]
            _check(out, sample, dec)
            assert out["__crop__"][2:] == (crop.width, crop.height)
        ds.close()
    # a fixed tile that does not fit an image names both
    ds = ShardedDataset(url, decode=CropDecoder(FixedCrop(0, 0, 700, 10)))
    with pytest.raises(ConfigError, match=r"\(0, 0, 700, 10\) is not inside image 'img0000.jpg'"):
        ds[0]
    ds.close()


@pytest.mark.s3
def test_streaming_over_seaweedfs_with_workers(seaweed: Any, tmp_path: Path) -> None:
    url = seaweed.new_url("crops")
    raw = {s["__key__"]: s for s in _write(url, n=16, storage_options=seaweed.storage_options)}
    dec = CropDecoder(RandomResizedCrop(), size=(64, 64), seed=3)
    ds = StreamingDataset(
        url,
        cache_dir=tmp_path / "cache",
        storage_options=seaweed.storage_options,
        decode=dec,
        shuffle=True,
    )
    got0 = {s["__key__"]: s for s in ds}
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list)
    got2 = {s["__key__"]: s for b in loader for s in b}
    assert set(got0) == set(got2) == set(raw)
    for key, out in got0.items():
        _check(out, raw[key], dec)
        # the same crop whichever process drew it
        assert got2[key]["__crop__"] == out["__crop__"]
        assert torch.equal(got2[key]["jpg"], out["jpg"])
    ds.close()


def test_crop_decoder_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="crop must be"):
        CropDecoder("random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="image must be"):
        CropDecoder(image="pil")
    with pytest.raises(ConfigError, match="RandomResizedCrop needs"):
        RandomResizedCrop(scale=(0.5, 0.1))


@pytest.mark.parametrize("workers", [0, 2])
def test_fastload_dataloader_batches_equal_the_dataset_items(tmp_path: Path, workers: int) -> None:
    url = str(tmp_path / "ds")
    _write(url, n=9)
    dec = CropDecoder(RandomResizedCrop(), size=(48, 64), seed=2)
    ds = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    by_key = {s["__key__"]: s for s in (ds[i] for i in range(len(ds)))}
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=workers, shuffle=True, seed=0)
    seen = 0
    for batch in loader:
        for j, key in enumerate(batch["__key__"]):
            assert torch.equal(batch["jpg"][j], by_key[key]["jpg"])
            assert torch.equal(batch["seg.png"][j], by_key[key]["seg.png"])
            seen += 1
    assert seen == len(ds)
    ds.close()
