"""Epochs of stored pixels built in the loader's process (fastload.loader.pixel_batches):
once every sample of an epoch is in the pixel tier, ``fastload.DataLoader`` builds its
batches from the mapped pixel shards with no worker process; each image equals a fresh
decode and each batch equals the workers' batch (the same order, the other fields as
they collate them), resume is exact, a filling epoch goes through the workers, and the
settings that change what a batch is keep every epoch there. Over SeaweedFS."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.cache import DiskTier
from fastload.cache.derived import derived_kind
from fastload.datasets.pixels import CHUNK_SAMPLES
from fastload.decode import Decoder
from fastload.decode.pixels import BAD, PixelShardView
from fastload.errors import DecodeError
from fastload.packed import PackedBytes
from fastload.sampling import World
from fastload.shards.writer import ShardWriter

SIZE = (24, 20)
N = 75


def _smooth(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = [
        128 + 90 * np.sin(xx / (6 + seed % 5) + p) * np.cos(yy / (4 + seed % 3) - p)
        for p in range(channels)
    ]
    arr = np.stack(planes, axis=-1).clip(0, 255).astype(np.uint8)
    return arr[:, :, 0] if channels == 1 else arr


def _encode(arr: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    img = Image.fromarray(arr)
    if mode is not None:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def _sample(i: int, mixed: bool) -> dict[str, Any]:
    """An RGB JPEG large enough to draft, a grayscale or CMYK JPEG, or (``mixed``) a
    PNG under another field name; a class and a text field."""
    h, w = 40 + (i * 7) % 60, 50 + (i * 11) % 70
    kind = i % 4
    if kind == 0:
        field, data = "jpg", _encode(_smooth(h * 3, w * 3, i), "JPEG")
    elif kind == 1:
        field, data = "jpg", _encode(_smooth(h, w, i, 1), "JPEG")
    elif kind == 2:
        field, data = "jpg", _encode(_smooth(h, w, i), "JPEG", mode="CMYK")
    else:
        field, data = ("png" if mixed else "jpg"), _encode(_smooth(h, w, i), "PNG")
    return {"__key__": f"k{i:04d}", field: data, "cls": i % 5, "txt": f"item {i}".encode()}


def _write(seaweed: Any, mixed: bool = False) -> tuple[str, Any]:
    url, opts = seaweed.new_url("pxb"), seaweed.storage_options
    with ShardWriter(url, shard_size="120KB", storage_options=opts) as w:
        for i in range(N):
            w.write(_sample(i, mixed))
    assert len(w.manifest.shards) >= 3
    return url, w.manifest


def _parts(m: Any) -> int:
    return sum(-(-s.samples // CHUNK_SAMPLES) for s in m.shards)


def _dataset(seaweed: Any, url: str, cache: Path, **kw: Any) -> Any:
    kw.setdefault("decode", "tensor")
    kw.setdefault("size", SIZE)
    return fastload.ShardedDataset(
        url, cache_dir=cache, storage_options=seaweed.storage_options, pixel_cache=True, **kw
    )


def _loader(ds: Any, workers: int, **kw: Any) -> fastload.DataLoader:
    kw.setdefault("shuffle", True)
    return fastload.DataLoader(
        ds, batch_size=8, num_workers=workers, seed=7, world=World.single(), **kw
    )


def _fresh(seaweed: Any, url: str, cache: Path) -> dict[str, dict[str, Any]]:
    raw = fastload.ShardedDataset(url, cache_dir=cache, storage_options=seaweed.storage_options)
    dec = Decoder(image="tensor", size=SIZE, resize="exact")
    want = {str(raw[i]["__key__"]): dec(raw[i]) for i in range(len(raw))}
    raw.close()
    return want


def _same(got: Any, want: Any, where: str = "batch") -> None:
    """``got`` is ``want``: the same fields in the same order, tensors of one dtype,
    shape, layout (strides) and content, lists item by item, packed bytes equal."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
        assert torch.equal(got, want), where
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{k}]")
    elif isinstance(want, PackedBytes):
        assert got.tolist() == want.tolist(), where
    else:
        assert got == want, where


def _check_images(batch: dict[str, Any], want: dict[str, dict[str, Any]]) -> int:
    seen = 0
    for k, key in enumerate(batch["__key__"]):
        for field in ("jpg", "png"):
            if field not in want[key]:
                continue
            value = batch[field]
            image = value[k]
            assert image is not None
            assert torch.equal(image, want[key][field]), f"{key}.{field}"
            seen += 1
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_of_stored_pixels_are_built_here_equal_to_a_fresh_decode_and_the_workers(
    seaweed: Any, tmp_path: Path, workers: int
) -> None:
    url, m = _write(seaweed)
    cache = tmp_path / "cache"
    want = _fresh(seaweed, url, cache)
    ds = _dataset(seaweed, url, cache)
    loader = _loader(ds, workers)
    plan = loader.transport_plan
    assert plan.pixel_batches
    assert "pixel tier: an epoch whose every sample is stored" in plan.why
    # the reference: the same order through the workers every epoch
    ref_ds = _dataset(seaweed, url, cache)
    reference = _loader(ref_ds, workers, transport="pickle")
    assert not reference.transport_plan.pixel_batches

    first = list(loader)  # epoch 0 fills the tier, through the workers
    assert loader.worker_processes == workers
    io = loader.io_stats()
    assert io["pixel_built"] == _parts(m)
    assert io["pixel_hits"] + io["pixel_decoded"] == N
    assert len(ds.pixels.missing(np.arange(N))) == 0
    ref = list(reference)
    for b, r in zip(first, ref, strict=True):
        _same(b, r)
    for epoch in (1, 2):
        before = loader.io_stats()
        got = list(loader)
        assert loader.worker_processes == 0  # built in this process
        after = loader.io_stats()
        assert after["pixel_hits"] - before["pixel_hits"] == N
        assert after["pixel_built"] == before["pixel_built"]
        assert after["pixel_decoded"] == before["pixel_decoded"]
        ref = list(reference)
        assert reference.worker_processes == workers
        assert len(got) == len(ref) == len(loader) == -(-N // 8)
        seen = 0
        for b, r in zip(got, ref, strict=True):
            _same(b, r)  # fields, order, dtypes, channels-last layout, contents
            assert b["jpg"].shape[1:] == (3, *SIZE)
            seen += _check_images(b, want)
        assert seen == N, epoch
        # shuffled: each epoch its own order, every sample once
        keys = [k for b in got for k in b["__key__"]]
        assert sorted(keys) == sorted(want)
        assert keys != [k for b in first for k in b["__key__"]]
    ds.close()
    ref_ds.close()


def test_mixed_image_fields_collate_as_on_the_workers(seaweed: Any, tmp_path: Path) -> None:
    # samples whose image is "jpg" or "png": each field is a list with None where a
    # sample lacks it, as the workers' collate makes it
    url, _ = _write(seaweed, mixed=True)
    cache = tmp_path / "cache"
    want = _fresh(seaweed, url, cache)
    ds = _dataset(seaweed, url, cache)
    loader = _loader(ds, 2)
    ref = _loader(_dataset(seaweed, url, cache), 2, transport="pickle")
    list(loader)  # fills the tier
    list(ref)
    for _ in range(2):
        got, expected = list(loader), list(ref)
        assert loader.worker_processes == 0
        seen = 0
        for b, r in zip(got, expected, strict=True):
            _same(b, r)
            if "png" in b:  # a list with None for the samples without one
                assert isinstance(b["png"], list)
                assert isinstance(b["jpg"], list)
            seen += _check_images(b, want)
        assert seen == N
    ds.close()


def test_an_incomplete_tier_sends_the_epoch_through_the_workers_which_fill_it(
    seaweed: Any, tmp_path: Path
) -> None:
    url, m = _write(seaweed)
    cache = tmp_path / "cache"
    ds = _dataset(seaweed, url, cache)
    every = np.arange(N)
    assert ds.pixels.missing(every).tolist() == every.tolist()  # nothing stored yet
    # the first pixel shard stored (samples 0..31 of shard 0) from this process
    first_shard = m.shards[0].samples
    ds[0]
    stored = min(CHUNK_SAMPLES, first_shard)
    assert ds.pixels.missing(every).tolist() == list(range(stored, N))
    loader = _loader(ds, 2)
    before = loader.io_stats()
    got = list(loader)  # incomplete: through the workers, which build the rest
    assert loader.worker_processes == 2
    after = loader.io_stats()
    assert after["pixel_built"] - before["pixel_built"] == _parts(m) - 1
    assert len(ds.pixels.missing(every)) == 0
    assert sum(len(b["__key__"]) for b in got) == N
    list(loader)
    assert loader.worker_processes == 0  # now complete: built here
    # a resumed epoch is checked on its remaining indices only
    assert ds.pixels.missing(every[:0]).size == 0
    ds.close()


def test_resume_mid_epoch_on_stored_pixels_gives_the_uninterrupted_stream(
    seaweed: Any, tmp_path: Path
) -> None:
    url, _ = _write(seaweed)
    cache = tmp_path / "cache"
    filler = _loader(_dataset(seaweed, url, cache), 2)
    list(filler)  # epoch 0 fills the tier
    whole = _loader(_dataset(seaweed, url, cache), 2)
    whole.set_epoch(1)
    expected = list(whole)
    assert whole.worker_processes == 0

    cut = _loader(_dataset(seaweed, url, cache), 2)
    cut.set_epoch(1)
    head = []
    for batch in cut:
        head.append(batch)
        if len(head) == 3:
            break
    state = cut.state_dict()
    # in the same process: the next iter() yields the rest
    rest_here = list(cut)
    assert cut.worker_processes == 0
    # from the state, in a new loader over a new dataset
    resumed = _loader(_dataset(seaweed, url, cache), 2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert resumed.worker_processes == 0
    assert len(head) + len(rest) == len(expected)
    for b, e in zip(head + rest, expected, strict=True):
        _same(b, e)
    for b, e in zip(head + rest_here, expected, strict=True):
        _same(b, e)
    # and the same batches through the workers, resumed from the same state
    workers = _loader(_dataset(seaweed, url, cache), 2, transport="pickle")
    workers.load_state_dict(state)
    for b, e in zip(list(workers), rest, strict=True):
        _same(b, e)
    assert workers.worker_processes == 2


def test_pin_memory_batches_are_pinned_as_torch_pins_the_workers(
    seaweed: Any, tmp_path: Path
) -> None:
    url, _ = _write(seaweed)
    cache = tmp_path / "cache"
    list(_loader(_dataset(seaweed, url, cache), 2))  # fills the tier
    # drop_last too: the short last batch is dropped as torch's BatchSampler drops it
    kw: dict[str, Any] = {"pin_memory": True, "drop_last": True}
    loader = _loader(_dataset(seaweed, url, cache), 2, **kw)
    ref = _loader(_dataset(seaweed, url, cache), 2, transport="pickle", **kw)
    assert loader.transport_plan.pixel_batches
    got, expected = list(loader), list(ref)
    assert loader.worker_processes == 0
    assert len(got) == len(expected) == len(loader) == N // 8
    cuda = torch.cuda.is_available()
    for b, r in zip(got, expected, strict=True):
        _same(b, r)
        for name in ("jpg", "cls"):
            # pinned where CUDA is (torch's pin thread pins the workers' batches)
            assert b[name].is_pinned() == r[name].is_pinned() == cuda


def _never(batch: list[Any]) -> Any:
    return batch


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"transform": lambda s: s}, "the dataset has a transform"),
        ({"collate_fn": _never}, "a collate_fn was given"),
        ({"sampler": list(range(N))}, "a sampler or batch_sampler was given"),
        ({"transport": "pickle"}, "transport='pickle' asked"),
        ({"size": 24}, "its images do not decode to one fixed shape"),
        ({"decode": "numpy"}, "its images do not decode to one fixed shape"),
    ],
)
def test_settings_that_change_a_batch_keep_every_epoch_on_the_workers(
    seaweed: Any, tmp_path: Path, settings: dict[str, Any], why: str
) -> None:
    url, _ = _write(seaweed)
    cache = tmp_path / "cache"
    ds_keys = ("transform", "size", "decode")
    ds = _dataset(seaweed, url, cache, **{k: v for k, v in settings.items() if k in ds_keys})
    kw = {k: v for k, v in settings.items() if k not in ds_keys}
    if "sampler" in kw:
        kw["shuffle"] = False
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, world=World.single(), **kw)
    plan = loader.transport_plan
    assert not plan.pixel_batches
    assert f"pixel tier: every epoch goes through the workers ({why}" in plan.why
    if "transform" in settings:
        for _ in range(2):  # the second epoch too: every sample stored, still the workers
            assert sum(len(b["__key__"]) for b in loader) == N
            assert loader.worker_processes == 2
        assert len(ds.pixels.missing(np.arange(N))) == 0
    ds.close()


def test_other_datasets_with_the_tier_stay_on_the_workers(seaweed: Any, tmp_path: Path) -> None:
    from fastload.decode import CropDecoder, FixedCrop

    url, _ = _write(seaweed)
    cache, opts = tmp_path / "cache", seaweed.storage_options
    streaming = fastload.StreamingDataset(
        url, cache_dir=cache, storage_options=opts, decode="tensor", size=SIZE, pixel_cache=True
    )
    plan = fastload.DataLoader(streaming, batch_size=8, num_workers=2).transport_plan
    assert not plan.pixel_batches  # an iterable dataset walks its own plan
    crops = fastload.ShardedDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode=CropDecoder(FixedCrop(0, 0, 16, 16), size=SIZE),
        pixel_cache=True,
    )
    plan = fastload.DataLoader(crops, batch_size=8, num_workers=2).transport_plan
    assert not plan.pixel_batches
    assert "pixel tier: every epoch goes through the workers" in plan.why
    streaming.close()
    crops.close()


def test_worker_counters_of_the_tier_count_each_sample_once(seaweed: Any, tmp_path: Path) -> None:
    # the loader's own copy of the dataset has counted reads before the workers fork:
    # each worker counts from zero, not from what it inherited
    url, m = _write(seaweed)
    cache = tmp_path / "cache"
    ds = _dataset(seaweed, url, cache)
    for i in range(10):
        ds[i]
    assert ds.io_stats()["pixel_built"] == 1
    loader = _loader(ds, 2, transport="pickle")
    list(loader)
    io = loader.io_stats()
    assert io["pixel_hits"] + io["pixel_decoded"] == N
    assert io["pixel_built"] == _parts(m) - 1
    list(loader)
    io = loader.io_stats()
    assert io["pixel_hits"] + io["pixel_decoded"] == 2 * N
    assert io["pixel_built"] == _parts(m) - 1
    ds.close()


def test_exact_size_pixel_shards_keep_original_sizes_and_bad_images(
    seaweed: Any, tmp_path: Path
) -> None:
    # an exact size is stored without reading each header first: the original sizes
    # are recorded as the images decode, and a bad image is a BAD record of zeros
    # that a read (in the loader's process too) decodes afresh and raises for
    url, opts = seaweed.new_url("pxb"), seaweed.storage_options
    good = _encode(_smooth(64, 64, 1), "JPEG")
    with ShardWriter(url, shard_size="10MB", storage_options=opts) as w:
        for i in range(20):
            data = good[: len(good) // 3] if i == 6 else _sample(i, False)["jpg"]
            w.write({"__key__": f"k{i:04d}", "jpg": data, "cls": i % 5})
    (shard,) = w.manifest.shards
    cache = tmp_path / "cache"
    ds = _dataset(seaweed, url, cache)
    raw = fastload.ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=SIZE, resize="exact")
    for i in range(len(ds)):
        if i == 6:
            with pytest.raises(DecodeError) as err:
                ds[i]
            assert shard.name in str(err.value)
            assert "k0006" in str(err.value)
        else:
            assert torch.equal(ds[i]["jpg"], fresh(raw[i])["jpg"])
    assert len(ds.pixels.missing(np.arange(20))) == 0
    tier = DiskTier(cache, sweep=False)
    try:
        (entry,) = [e for e in tier.entries() if derived_kind(e.shard) == "px"]
    finally:
        tier.close()
    view = PixelShardView((cache / "data" / entry.name).read_bytes(), entry.name)
    images = [r for r in view.records if view.names[int(r["field"])] == "jpg"]
    assert len(images) == 20
    for rec in images:
        j = int(rec["sample"])
        if j == 6:
            assert int(rec["kind"]) == BAD
            assert not any(bytes(view.buffer[int(rec["offset"]) :][: int(rec["nbytes"])]))
            continue
        with Image.open(io.BytesIO(raw[j]["jpg"])) as img:
            assert (int(rec["orig_width"]), int(rec["orig_height"])) == img.size
    loader = _loader(ds, 0, shuffle=False)
    with pytest.raises(DecodeError) as err:
        list(loader)
    assert "k0006" in str(err.value)
    assert loader.worker_processes == 0  # every pixel shard stored: built here
    ds.close()
    raw.close()
