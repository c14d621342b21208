"""Random crops from the decoded-pixel tier (``pixel_cache=`` with
``decode=CropDecoder(...)`` on ShardedDataset and StreamingDataset), over SeaweedFS.

Each item equals "the stored pixels (a fresh decode at ``max_side``), then the same
crop box (the region-decode path's draw, ``__crop__``) scaled to them, then the same
resize", exactly, for every image over two epochs, through 0 and 2 workers (persistent
ones: ``set_epoch`` reaches them); the second epoch decodes nothing (the tier's own
counters in every process that served an item); epochs draw differently, seeds
reproduce; masks are cut exactly as the region-decode path cuts them; ``Tiles`` is
refused with the reason.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from PIL import Image

import fastload
from fastload import PixelCache, ShardedDataset, StreamingDataset
from fastload.cache import DiskTier
from fastload.decode import CropDecoder, RandomPatch, RandomResizedCrop, Tiles, decode_image
from fastload.errors import ConfigError
from fastload.sampling import World
from fastload.shards.writer import ShardWriter

from .images import encode, photo_like

MAX_SIDE = 64
OUT = (24, 24)


def _sample(i: int) -> dict[str, Any]:
    """A JPEG (most larger than MAX_SIDE, some smaller: kept at their size), every
    fifth a PNG, with a class and a mask whose class changes at the image's middle."""
    w, h = 40 + (i * 37) % 150, 36 + (i * 23) % 110
    img = photo_like(w, h, seed=i)
    data = encode(img, "PNG") if i % 5 == 4 else encode(img, "JPEG", quality=90)
    mask = np.zeros((h, w), dtype=np.uint8)
    mask[h // 2 :, :] = 3
    mask[:, w // 2 :] += 1
    field = "png" if i % 5 == 4 else "jpg"
    return {"__key__": f"img{i:04d}", field: data, "cls": i % 7, "seg.png": encode(mask, "PNG")}


def _write(url: str, n: int, opts: Any) -> None:
    with ShardWriter(url, shard_size="40KB", storage_options=opts) as w:
        for i in range(n):
            w.write(_sample(i))


def _image_field(sample: dict[str, Any]) -> str:
    return "png" if "png" in sample else "jpg"


def _stored(data: Any) -> np.ndarray:
    """What the tier stores: a fresh full decode, bounded by MAX_SIDE (longer side)."""
    probe = decode_image(bytes(data))
    size = MAX_SIDE if max(probe.size) > MAX_SIDE else None
    arr = np.asarray(decode_image(bytes(data), size=size, resize="longer"))
    return arr


def _expected(raw: dict[str, Any], box: tuple[int, int, int, int]) -> torch.Tensor:
    """The stored pixels, the box scaled to them, Pillow's bilinear resize to OUT."""
    data = raw[_image_field(raw)]
    stored = _stored(data)
    ow, oh = decode_image(bytes(data)).size
    sx, sy = stored.shape[1] / ow, stored.shape[0] / oh
    left, top, w, h = box
    scaled = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    out = Image.fromarray(stored).resize((OUT[1], OUT[0]), Image.Resampling.BILINEAR, box=scaled)
    return torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1)


def _by_key(items: Any) -> dict[str, Any]:
    return {s["__key__"]: s for s in items}


class Stamp:
    """A transform that adds, to each item, the pid and the tier's counters of the
    process serving it (the dataset's copy in that process: workers are forked)."""

    def __init__(self) -> None:
        self.ds: Any = None

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        s["_stats"] = (os.getpid(), dict(self.ds.pixels.stats))
        return s


def _decodes(items: dict[str, Any]) -> dict[int, int]:
    """Per serving process, the most pixel decodes (shards built + samples decoded
    afresh) it had done when it served one of ``items``."""
    out: dict[int, int] = {}
    for s in items.values():
        pid, st = s["_stats"]
        out[pid] = max(out.get(pid, 0), st["built"] + st["decoded"])
    return out


def _check_epoch(got: dict[str, Any], region: dict[str, Any], raws: dict[str, Any]) -> None:
    assert set(got) == set(region) == set(raws)
    for key, item in got.items():
        want = region[key]
        # the region-decode path's draw, the same semantics
        assert item["__crop__"] == want["__crop__"], key
        field = _image_field(raws[key])
        assert item[field].dtype == torch.uint8
        assert tuple(item[field].shape) == (3, *OUT)
        assert torch.equal(item[field], _expected(raws[key], item["__crop__"])), key
        # masks are cut at the original resolution with the same box: as region decode
        assert torch.equal(item["seg.png"], want["seg.png"]), key
        assert item["cls"] == want["cls"] == int(raws[key]["cls"])


@pytest.mark.parametrize("workers", [0, 2])
def test_sharded_tier_crops_equal_stored_pixels_cut_every_epoch(
    seaweed: Any, tmp_path: Path, workers: int
) -> None:
    url, opts = seaweed.new_url("cpx"), seaweed.storage_options
    _write(url, 30, opts)
    cache = tmp_path / "cache"
    dec = CropDecoder(RandomResizedCrop(), size=OUT, seed=11)
    stamp = Stamp()
    ds = ShardedDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode=dec,
        pixel_cache=PixelCache(max_side=MAX_SIDE),
        transform=stamp,
    )
    stamp.ds = ds
    assert len(ds.manifest.shards) >= 3
    region = ShardedDataset(url, cache_dir=cache, storage_options=opts, decode=dec)
    plain = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    raws = {s["__key__"]: s for s in (plain[i] for i in range(len(plain)))}
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=list,
    )
    got: dict[int, dict[str, Any]] = {}
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        region.set_epoch(epoch)
        got[epoch] = _by_key(s for b in loader for s in b)
        want = _by_key(region[i] for i in range(len(region)))
        _check_epoch(got[epoch], want, raws)
    del loader
    # epoch 1 filled the tier; epoch 2 decoded nothing in any process
    first, second = _decodes(got[0]), _decodes(got[1])
    assert sum(first.values()) > 0
    for pid, n in second.items():
        assert n == first.get(pid, 0), (pid, n, first)
    if workers == 0:
        assert ds.pixels is not None
        assert ds.pixels.stats["hits"] >= len(ds)
    # another epoch draws other boxes
    crops = [{k: s["__crop__"] for k, s in got[e].items()} for e in (0, 1)]
    assert sum(crops[0][k] != crops[1][k] for k in crops[0]) >= len(crops[0]) // 2
    ds.close()
    region.close()
    plain.close()


def test_epoch_two_decodes_nothing_and_seeds_reproduce(seaweed: Any, tmp_path: Path) -> None:
    url, opts = seaweed.new_url("cpx"), seaweed.storage_options
    _write(url, 20, opts)
    cache = tmp_path / "cache"

    def make(seed: int) -> ShardedDataset:
        return ShardedDataset(
            url,
            cache_dir=cache,
            storage_options=opts,
            decode=CropDecoder(RandomResizedCrop(), size=OUT, seed=seed),
            pixel_cache=PixelCache(max_side=MAX_SIDE),
        )

    ds = make(3)
    assert ds.pixels is not None
    boxes = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        before = dict(ds.pixels.stats)
        items = [ds[i] for i in range(len(ds))]
        after = dict(ds.pixels.stats)
        boxes.append([s["__crop__"] for s in items])
        if epoch == 1:
            assert after["built"] == before["built"]
            assert after["decoded"] == before["decoded"]
            assert after["hits"] - before["hits"] == len(ds)
        else:
            assert after["built"] > 0
    assert boxes[0] != boxes[1]
    # another dataset (another process's view: the tier already full) with the same
    # seed draws the same boxes and serves the same pixels, decoding nothing
    again = make(3)
    assert again.pixels is not None
    for epoch in (1, 0):
        again.set_epoch(epoch)
        ds.set_epoch(epoch)
        assert [again[i]["__crop__"] for i in range(len(again))] == boxes[epoch]
        for i in range(len(ds)):
            field = "png" if i % 5 == 4 else "jpg"
            assert torch.equal(again[i][field], ds[i][field]), (epoch, i)
    assert again.pixels.stats["built"] == again.pixels.stats["decoded"] == 0
    other = make(4)
    other.set_epoch(0)
    assert [other[i]["__crop__"] for i in range(len(other))] != boxes[0]
    for d in (ds, again, other):
        d.close()


def test_streaming_tier_crops_through_persistent_workers(seaweed: Any, tmp_path: Path) -> None:
    url, opts = seaweed.new_url("cpx"), seaweed.storage_options
    _write(url, 30, opts)
    cache = tmp_path / "cache"
    dec = CropDecoder(RandomResizedCrop(), size=OUT, seed=5)
    stamp = Stamp()
    ds = StreamingDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode=dec,
        pixel_cache=PixelCache(max_side=MAX_SIDE),
        transform=stamp,
        world=World(),
        seed=2,
    )
    stamp.ds = ds
    region = ShardedDataset(url, cache_dir=cache, storage_options=opts, decode=dec)
    plain = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    raws = {s["__key__"]: s for s in (plain[i] for i in range(len(plain)))}
    loader = fastload.DataLoader(
        ds, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=list
    )
    got: dict[int, dict[str, Any]] = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got[epoch] = _by_key(s for b in loader for s in b)
        region.set_epoch(epoch)
        _check_epoch(got[epoch], _by_key(region[i] for i in range(len(region))), raws)
    loader.close()
    first, second = _decodes(got[0]), _decodes(got[1])
    assert sum(first.values()) > 0
    for pid, n in second.items():
        assert n == first.get(pid, 0), (pid, n, first)
    assert {k: s["__crop__"] for k, s in got[0].items()} != {
        k: s["__crop__"] for k, s in got[1].items()
    }
    ds.close()
    region.close()
    plain.close()


def test_full_size_tier_patches_equal_region_decode(seaweed: Any, tmp_path: Path) -> None:
    """Stored at full size (``pixel_cache=True``), a patch without resize is the very
    region the region decode gives (image and mask), pixel for pixel."""
    url, opts = seaweed.new_url("cpx"), seaweed.storage_options
    _write(url, 12, opts)
    cache = tmp_path / "cache"
    dec = CropDecoder(RandomPatch(32, 24), seed=9, image="numpy")
    ds = ShardedDataset(url, cache_dir=cache, storage_options=opts, decode=dec, pixel_cache=True)
    region = ShardedDataset(url, cache_dir=cache, storage_options=opts, decode=dec)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        region.set_epoch(epoch)
        for i in range(len(ds)):
            got, want = ds[i], region[i]
            assert got.keys() == want.keys()
            assert got["__crop__"] == want["__crop__"]
            for name in got:
                if isinstance(want[name], np.ndarray):
                    assert np.array_equal(got[name], want[name]), (i, name)
    assert ds.pixels is not None
    assert ds.pixels.stats["decoded"] == 0
    ds.close()
    region.close()


def test_tiles_with_the_tier_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url) as w:
        w.write(_sample(0))
    for cls in (ShardedDataset, StreamingDataset):
        with pytest.raises(ConfigError, match=r"Tiles.*original resolution"):
            cls(
                url,
                cache_dir=tmp_path / "cache",
                decode=CropDecoder(Tiles(16, 16)),
                pixel_cache=True,
            )


def test_no_room_for_pixels_gives_the_same_crops(seaweed: Any, tmp_path: Path) -> None:
    """A cap that holds the raw shards but not every pixel shard: a crop whose pixel
    shard found no room is cut from a fresh decode at ``max_side``, equal to the crop a
    roomy tier serves (items never depend on what the cache holds), warned once."""
    url, opts = seaweed.new_url("cpx"), seaweed.storage_options
    _write(url, 16, opts)
    roomy = tmp_path / "roomy"
    dec = CropDecoder(RandomResizedCrop(), size=OUT, seed=1)
    full = ShardedDataset(
        url,
        cache_dir=roomy,
        storage_options=opts,
        decode=dec,
        pixel_cache=PixelCache(max_side=MAX_SIDE),
    )
    small = tmp_path / "small"
    tier = DiskTier(small)
    total = full.manifest.total_bytes
    tier.set_limit(tier.metadata_bytes(least=True) + 16 * 1024 + total + total // 4)
    tier.close()
    tight = ShardedDataset(
        url,
        cache_dir=small,
        storage_options=opts,
        decode=CropDecoder(RandomResizedCrop(), size=OUT, seed=1),
        pixel_cache=PixelCache(max_side=MAX_SIDE),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in (0, 1):
            full.set_epoch(epoch)
            tight.set_epoch(epoch)
            for i in range(len(full)):
                a, b = tight[i], full[i]
                assert a["__crop__"] == b["__crop__"]
                field = "png" if i % 5 == 4 else "jpg"
                assert torch.equal(a[field], b[field]), (epoch, i)
                assert torch.equal(a["seg.png"], b["seg.png"])
    assert len([w for w in caught if "pixel_cache" in str(w.message)]) == 1
    assert tight.pixels is not None
    st = tight.pixels.stats
    # some pixel shards found no room (decoded afresh each epoch), any others were read
    assert st["no_room"] >= 1
    assert st["decoded"] >= 2
    assert st["hits"] + st["decoded"] == 2 * len(tight)
    full.close()
    tight.close()
