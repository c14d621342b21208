"""The tiled mode for very large images: ``CropDecoder(Tiles(...))`` serves every tile
of each image as its own sample through ``ShardedDataset`` (index -> (sample, tile))
and ``StreamingDataset`` (tiles planned, shuffled and split as units); the tiles of a
4096x4096 JPEG reassemble to its full decode exactly and its mask's tiles to the mask."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import ShardedDataset, StreamingDataset
from fastload.decode import CropDecoder, Tiles, crop_decoder
from fastload.errors import ConfigError, DecodeError
from fastload.shards.writer import ShardWriter

from .images import encode

#: (width, height) of the samples: a 4K image, one whose size is no multiple of the
#: tile (its last row and column move back to the border), one smaller than a tile
SIZES = [(4096, 4096), (1000, 700), (300, 200)]


def _image(width: int, height: int, seed: int) -> np.ndarray:
    """Photo-like content, cheap at 4K: smooth colour fields, edges and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 128 + 100 * np.sin(x / 97.0 + seed) * np.cos(y / 131.0)
    g = 128 + 90 * np.sin((x + y) / 211.0)
    b = np.where((x // 256 + y // 256) % 2 == 0, 60.0, 190.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _mask(width: int, height: int) -> np.ndarray:
    """A label image whose every pixel says where it is."""
    y, x = np.mgrid[0:height, 0:width]
    return ((x // 4 + (y // 4) * 7) % 256).astype(np.uint8)


@pytest.fixture(scope="module")
def tiled_url(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    url = str(tmp_path_factory.mktemp("tiles") / "ds")
    samples = []
    with ShardWriter(url, shard_size="4MB") as w:
        for i, (width, height) in enumerate(SIZES):
            sample = {
                "__key__": f"scan{i}",
                "jpg": encode(_image(width, height, i), "JPEG", quality=90),
                "seg.png": encode(_mask(width, height), "PNG"),
            }
            w.write(sample)
            samples.append(sample)
    return url, samples


def test_tile_grid_covers_the_image() -> None:
    grid = Tiles(512, 512).grid(1000, 700)
    assert [(r, c) for r, c, _ in grid] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [b for _, _, b in grid] == [
        (0, 0, 512, 512),
        (488, 0, 512, 512),
        (0, 188, 512, 512),
        (488, 188, 512, 512),
    ]
    assert Tiles(512, 512).grid(300, 200) == [(0, 0, (0, 0, 300, 200))]
    # overlapping tiles: a stride below the tile's size
    assert Tiles(512, 512, stride_x=256, stride_y=512).count(1024, 512) == 3
    assert Tiles(512, 512).count(4096, 4096) == 64
    with pytest.raises(ConfigError, match="Tiles needs positive"):
        Tiles(0, 512)
    with pytest.raises(ConfigError, match="makes several samples"):
        CropDecoder(Tiles(64, 64))({"__key__": "a", "jpg": b""})


@pytest.mark.parametrize("decoder", ["native", "pillow"])
def test_tiles_reassemble_the_4k_image_and_its_mask(
    tiled_url: tuple[str, list[dict[str, Any]]], decoder: str
) -> None:
    if decoder == "native" and crop_decoder("auto") != "native":
        pytest.fail("the native region decoder is not built in this checkout")
    url, samples = tiled_url
    dec = CropDecoder(Tiles(512, 512), image="numpy", decoder=decoder)
    ds = ShardedDataset(url, decode=dec)
    counts = [64, 4, 1]
    assert len(ds) == sum(counts)
    u = 0
    for sample, (width, height) in zip(samples, SIZES, strict=True):
        full = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
        canvas = np.zeros_like(full)
        mask = np.zeros((height, width), np.uint8)
        covered = np.zeros((height, width), bool)
        grid = Tiles(512, 512).grid(width, height)
        for row, col, box in grid:
            item = ds[u]
            u += 1
            assert item["__key__"] == f"{sample['__key__']}/{row}_{col}"
            assert item["__crop__"] == box
            left, top, w, h = box
            assert item["jpg"].shape == (h, w, 3) == (min(512, height), min(512, width), 3)
            # each tile equals that region of the full decode, exactly
            np.testing.assert_array_equal(item["jpg"], full[top : top + h, left : left + w])
            canvas[top : top + h, left : left + w] = item["jpg"]
            mask[top : top + h, left : left + w] = item["seg.png"]
            covered[top : top + h, left : left + w] = True
        assert covered.all()
        np.testing.assert_array_equal(canvas, full)
        np.testing.assert_array_equal(mask, _mask(width, height))
    with pytest.raises(IndexError, match="tile 69 of a dataset of 69 tiles"):
        ds[69]
    ds.close()


def test_streaming_serves_every_tile_once(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url, shard_size="300KB") as w:
        for i in range(6):
            width, height = SIZES[1 + i % 2]
            w.write(
                {
                    "__key__": f"scan{i}",
                    "jpg": encode(_image(width, height, i), "JPEG", quality=90),
                    "seg.png": encode(_mask(width, height), "PNG"),
                }
            )
    dec = CropDecoder(Tiles(256, 256, stride_x=200), image="tensor")
    by_key = {}
    ref = ShardedDataset(url, decode=dec)
    for u in range(len(ref)):
        item = ref[u]
        by_key[item["__key__"]] = item
    ref.close()
    n = 3 * Tiles(256, 256, stride_x=200).count(1000, 700) + 3 * 2  # 300x200: two tiles
    assert len(by_key) == n == 3 * 5 * 3 + 3 * 2
    ds = StreamingDataset(url, cache_dir=tmp_path / "cache", decode=dec, shuffle=True, seed=3)
    assert len(ds) == n
    for workers in (0, 2):
        loader = fastload.DataLoader(ds, batch_size=8, num_workers=workers, collate_fn=list)
        got = [s for b in loader for s in b]
        keys = [s["__key__"] for s in got]
        assert sorted(keys) == sorted(by_key)
        assert keys != sorted(keys, key=list(by_key).index)  # tiles shuffled as units
        for s in got:
            assert torch.equal(s["jpg"], by_key[s["__key__"]]["jpg"])
            assert torch.equal(s["seg.png"], by_key[s["__key__"]]["seg.png"])
        loader.close()
    ds.close()
    # map-style through fastload.DataLoader: the sampler's indices are tiles
    mapped = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    loader = fastload.DataLoader(mapped, batch_size=8, num_workers=2, shuffle=True, collate_fn=list)
    got = [s for b in loader for s in b]
    assert sorted(s["__key__"] for s in got) == sorted(by_key)
    for s in got:
        assert torch.equal(s["jpg"], by_key[s["__key__"]]["jpg"])
    loader.close()
    mapped.close()


def test_a_sample_without_an_image_is_named(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url) as w:
        w.write({"__key__": "a", "jpg": encode(_image(64, 64, 0), "JPEG")})
        w.write({"__key__": "b", "txt": b"no image"})
    ds = ShardedDataset(url, decode=CropDecoder(Tiles(32, 32)))
    with pytest.raises(DecodeError, match="sample 'b' has no image field"):
        len(ds)
    ds.close()
