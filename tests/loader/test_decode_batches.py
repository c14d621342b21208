"""Whole batches decoded straight into their batch memory (fastload.loader.decoded):
the same pixels as decoding sample by sample, written once into the batch tensor that
is handed on (shared memory from workers, recycled slabs on the loader's threads),
the fallbacks where images do not share one shape, and nothing left behind."""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.decode import Decoder
from fastload.errors import DecodeError
from fastload.loader.adapters import DecodeBatchAdapter, MapStatsAdapter
from fastload.loader.decoded import DecodedItems, decode_batch, fixed_image_shape
from fastload.loader.slabs import shared_pool
from fastload.loader.transport import collate_decoded


def _jpeg(i: int, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(i)
    shape = (48, 64, 3) if i % 2 else (70, 50, 3)
    img = Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8))
    buf = io.BytesIO()
    img.convert(mode).save(buf, "JPEG")
    return buf.getvalue()


def _samples(n: int) -> list[dict[str, Any]]:
    return [{"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": b"%d" % (i % 3)} for i in range(n)]


def _shards(tmp_path: Path, n: int, bad: int | None = None) -> str:
    url = f"file://{tmp_path}/shards"
    with fastload.ShardWriter(url, shard_size="40KB") as w:
        for i in range(n):
            data = b"\xff\xd8 not a jpeg" if i == bad else _jpeg(i)
            w.write({"__key__": f"s{i:05d}", "jpg": data, "cls": i % 3})
    return url


class _Alloc:
    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, shape: tuple[int, ...]) -> torch.Tensor:
        self.shapes.append(tuple(shape))
        return torch.empty(shape, dtype=torch.uint8)


@pytest.mark.parametrize(("layout", "mode"), [("CHW", "RGB"), ("HWC", "RGB"), ("CHW", "L")])
def test_images_land_in_their_slots_and_the_collate_hands_the_batch_on(
    layout: str, mode: str
) -> None:
    dec = Decoder(image="tensor", size=(32, 40), resize="exact", layout=layout, mode=mode)
    channels = 3 if mode == "RGB" else 1
    assert fixed_image_shape(dec) == (32, 40, channels)
    samples = _samples(7)
    alloc = _Alloc()
    items = decode_batch(samples, dec, alloc)
    assert isinstance(items, DecodedItems)
    assert alloc.shapes == [(7, 32, 40, channels)]  # one allocation per batch and field
    batch = items.batches["jpg"]
    for k, (item, sample) in enumerate(zip(items, samples, strict=True)):
        want = dec(sample)
        assert list(item) == list(want)  # the same fields in the same order
        assert torch.equal(item["jpg"], want["jpg"])
        assert item["jpg"].shape == want["jpg"].shape
        assert item["jpg"].data_ptr() == batch[k].data_ptr()  # decoded in place
        assert item["cls"] == want["cls"]
        assert item["__key__"] == want["__key__"]
    out = collate_decoded(items)
    assert out["jpg"].data_ptr() == batch.data_ptr()  # handed on, not copied
    assert torch.equal(out["jpg"], torch.stack([dec(s)["jpg"] for s in samples]))
    if layout == "CHW":
        assert out["jpg"].is_contiguous(memory_format=torch.channels_last)
    assert out["cls"].tolist() == [i % 3 for i in range(7)]
    assert out["__key__"] == [s["__key__"] for s in samples]


def test_a_changed_item_is_copied_not_handed_on() -> None:
    dec = Decoder(image="tensor", size=16, resize="exact")
    items = decode_batch(_samples(3), dec, _Alloc())
    assert isinstance(items, DecodedItems)
    items[1] = dict(items[1], jpg=torch.zeros(3, 16, 16, dtype=torch.uint8))
    out = collate_decoded(items)
    assert out["jpg"].data_ptr() != items.batches["jpg"].data_ptr()
    assert int(out["jpg"][1].sum()) == 0
    assert torch.equal(out["jpg"][2], items[2]["jpg"])


def test_images_of_varying_shape_decode_one_by_one() -> None:
    samples = _samples(4)
    alloc = _Alloc()
    shorter = Decoder(image="tensor", size=24)  # the output's shape follows the image
    assert fixed_image_shape(shorter) is None
    got = decode_batch(samples, shorter, alloc)
    assert not isinstance(got, DecodedItems)
    assert alloc.shapes == []
    for item, sample in zip(got, samples, strict=True):
        assert torch.equal(item["jpg"], shorter(sample)["jpg"])
    # one sample with a second image field: the batch is decoded sample by sample
    exact = Decoder(image="tensor", size=16, resize="exact")
    mixed = [dict(s) for s in samples]
    mixed[2]["left.png"] = _jpeg(9)
    got = decode_batch(mixed, exact, alloc)
    assert not isinstance(got, DecodedItems)
    assert alloc.shapes == []
    assert torch.equal(got[2]["left.png"], exact(mixed[2])["left.png"])
    for wanted in (Decoder(image="numpy", size=16, resize="exact"), Decoder(image="pil")):
        assert fixed_image_shape(wanted) is None
    assert fixed_image_shape(Decoder(image="tensor", size=16, resize="exact", mode=None)) is None


def _torch_shm(pids: list[int]) -> list[str]:
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    return [n for n in names if any(f"_{p}_" in n for p in pids)]


def test_workers_decode_whole_batches_into_shared_memory(tmp_path: Path) -> None:
    ds = fastload.ShardedDataset(_shards(tmp_path, 26), decode="tensor", size=(32, 40))
    loader = fastload.DataLoader(ds, batch_size=5, num_workers=2, shuffle=True)
    pids: list[int] = []
    try:
        assert isinstance(loader._adapter, DecodeBatchAdapter)
        got: dict[str, torch.Tensor] = {}
        for batch in loader:
            pids.extend(p.pid for p in multiprocessing.active_children() if p.pid)
            images = batch["jpg"]
            assert images.is_shared()  # the worker's shared memory, mapped here
            assert images.is_contiguous(memory_format=torch.channels_last)
            for i, key in enumerate(batch["__key__"]):
                got[key] = images[i]
            assert batch["cls"].dtype == torch.int64
        assert len(got) == len(ds) == 26
        for i in range(len(ds)):
            want = ds[i]
            assert torch.equal(got[want["__key__"]], want["jpg"])
    finally:
        loader.close()
        ds.close()
    del got, batch, images
    gc.collect()
    assert _torch_shm(sorted(set(pids))) == []


def _same(sample: Any) -> Any:
    return sample


def test_a_transform_or_varying_sizes_keep_per_sample_decoding(tmp_path: Path) -> None:
    url = _shards(tmp_path, 6)
    for ds, collate in (
        (fastload.ShardedDataset(url, decode="tensor", size=24), list),
        (fastload.ShardedDataset(url, decode="tensor", size=(24, 24), transform=_same), None),
    ):
        loader = fastload.DataLoader(ds, batch_size=3, num_workers=1, collate_fn=collate)
        try:
            assert type(loader._adapter) is MapStatsAdapter
            assert sum(len(b) if collate else len(b["__key__"]) for b in loader) == 6
        finally:
            loader.close()
            ds.close()


def test_a_corrupt_image_names_its_sample(tmp_path: Path) -> None:
    ds = fastload.ShardedDataset(_shards(tmp_path, 8, bad=5), decode="tensor", size=(16, 16))
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=1)
    try:
        with pytest.raises(DecodeError, match=r"s00005\.jpg"):
            list(loader)
    finally:
        loader.close()
        ds.close()


def test_the_loaders_threads_decode_into_recycled_slabs(tmp_path: Path) -> None:
    ds = fastload.ShardedDataset(_shards(tmp_path, 20), decode="tensor", size=(32, 40))
    loader = fastload.DataLoader(
        ds, batch_size=5, num_workers=0, transport="cache", decode_threads=2
    )
    pool = shared_pool()
    in_use = pool.stats().in_use
    try:
        batches = list(loader)
        assert pool.stats().in_use == in_use + len(batches)  # each batch holds its slab
        assert loader._builder is not None
        assert loader._builder.stats.decoded == 20
        got = {k: b["jpg"][i] for b in batches for i, k in enumerate(b["__key__"])}
        for i in range(len(ds)):
            want = ds[i]
            assert torch.equal(got[want["__key__"]], want["jpg"])
        assert all(b["jpg"].is_contiguous(memory_format=torch.channels_last) for b in batches)
    finally:
        loader.close()
        ds.close()
    del batches, got
    gc.collect()
    assert pool.stats().in_use == in_use  # every slab went back
