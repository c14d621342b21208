"""The decoded-pixel tier (``pixel_cache=``): pixels read from the node cache equal a
fresh decode byte for byte, every pixel shard is written once on the node (two
processes, two PID namespaces), a killed builder leaves nothing served, a corrupt
image is never stored and its error names the shard and key, and a cap too small for
the pixels keeps the loader decoding (warned once, counted). Over SeaweedFS."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data
from PIL import Image

from fastload import PixelCache
from fastload.cache import DiskTier
from fastload.cache.derived import derived_kind
from fastload.datasets.pixels import CHUNK_SAMPLES
from fastload.datasets.sharded import ShardedDataset
from fastload.datasets.streaming import StreamingDataset
from fastload.decode import Decoder, decode_image
from fastload.decode.pixels import BAD, PixelShardView
from fastload.errors import ConfigError, DecodeError
from fastload.sampling import World
from fastload.shards.writer import ShardWriter

CHILD = Path(__file__).resolve().parent / "pixel_child.py"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _smooth(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = [
        128 + 90 * np.sin(xx / (7 + seed % 5) + p) * np.cos(yy / (5 + seed % 3) - p)
        for p in range(channels)
    ]
    arr = np.stack(planes, axis=-1).clip(0, 255).astype(np.uint8)
    return arr[:, :, 0] if channels == 1 else arr


def _encode(arr: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    img = Image.fromarray(arr)
    if mode is not None:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def image_sample(i: int) -> dict[str, Any]:
    """Sample ``i``: a JPEG (RGB, some large enough to draft), a PNG, a grayscale
    JPEG, a CMYK JPEG or an RGBA PNG, with a class."""
    h, w = 40 + (i * 7) % 90, 50 + (i * 13) % 110
    kind = i % 5
    if kind == 0:
        field, data = "jpg", _encode(_smooth(h * 2, w * 2, i), "JPEG")
    elif kind == 1:
        field, data = "png", _encode(_smooth(h, w, i), "PNG")
    elif kind == 2:
        field, data = "jpg", _encode(_smooth(h, w, i, 1), "JPEG")
    elif kind == 3:
        field, data = "jpeg", _encode(_smooth(h, w, i), "JPEG", mode="CMYK")
    else:
        field, data = "png", _encode(np.dstack([_smooth(h, w, i), _smooth(h, w, i + 1, 1)]), "PNG")
    return {"__key__": f"img{i:04d}", field: data, "cls": i % 7}


def write_images(url: str, n: int, opts: Any, shard_size: str = "60KB", extra: Any = None) -> Any:
    with ShardWriter(url, shard_size=shard_size, storage_options=opts) as w:
        for i in range(n):
            w.write(image_sample(i))
            if extra is not None and i in extra:
                w.write(extra[i])
    return w.manifest


def _equal(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_equal(got[k], want[k]) for k in want)
    if isinstance(want, torch.Tensor):
        return got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    if isinstance(want, np.ndarray):
        return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    if isinstance(want, Image.Image):
        return got.mode == want.mode and got.size == want.size and got.tobytes() == want.tobytes()
    return bool(got == want)


def _counters(cache: Path) -> dict[str, float]:
    tier = DiskTier(cache)
    try:
        return tier.lifetime_counters()
    finally:
        tier.close()


def _pixel_entries(cache: Path) -> list[Any]:
    tier = DiskTier(cache, sweep=False)
    try:
        return [e for e in tier.entries() if derived_kind(e.shard) == "px"]
    finally:
        tier.close()


def _parts(m: Any) -> int:
    """Pixel shards of a dataset: one per ``CHUNK_SAMPLES`` samples of each shard."""
    return sum(-(-s.samples // CHUNK_SAMPLES) for s in m.shards)


def _collate(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_pixels_equal_a_fresh_decode_every_epoch(
    seaweed: Any, tmp_path: Path, workers: int
) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 40, opts)
    assert len(m.shards) >= 3
    cache = tmp_path / "cache"
    ds = ShardedDataset(
        url, cache_dir=cache, storage_options=opts, decode="tensor", size=24, pixel_cache=True
    )
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=24)
    want = {raw[i]["__key__"]: fresh(raw[i]) for i in range(len(raw))}
    for epoch in range(3):
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            collate_fn=_collate,
            generator=torch.Generator().manual_seed(epoch),
        )
        got = [s for batch in loader for s in batch]
        assert sorted(s["__key__"] for s in got) == sorted(want)
        for s in got:
            assert _equal(s, want[s["__key__"]]), s["__key__"]
    # one pixel shard per chunk of each source shard, each written once on the node
    entries = _pixel_entries(cache)
    assert len(entries) == _parts(m)
    assert all(e.state.name == "READY" for e in entries)
    assert _counters(cache).get("px_built") == _parts(m)
    # fastload cache stats shows the tier, its bytes counted in what the cap counts
    stats = subprocess.run(
        [sys.executable, "-m", "fastload", "cache", "stats", "--cache-dir", str(cache), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(stats.stdout)
    assert doc["pixel_shards"] == {
        "entries": _parts(m),
        "bytes": sum(e.size for e in entries),
    }
    assert doc["bytes_used"] == m.total_bytes + sum(e.size for e in entries) + sum(
        s.index_bytes for s in m.shards
    )
    ds.close()
    raw.close()


def test_outputs_pil_numpy_and_hwc_equal_a_fresh_decode(seaweed: Any, tmp_path: Path) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    write_images(url, 15, opts)
    cache = tmp_path / "cache"
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    settings: list[Any] = [
        "pil",
        "numpy",
        Decoder(image="tensor", size=(20, 30), resize="exact", layout="HWC"),
        Decoder(image="tensor", size=16, mode="L", resizer="pil"),
    ]
    for dec in settings:
        size = 28 if isinstance(dec, str) else None
        ds = ShardedDataset(
            url, cache_dir=cache, storage_options=opts, decode=dec, size=size, pixel_cache=True
        )
        ref = ds.decoder
        for _ in range(2):
            for i in range(len(ds)):
                assert _equal(ds[i], ref(raw[i])), (dec, i)
        assert ds.pixels is not None
        assert ds.pixels.stats["hits"] == 2 * len(ds)
        ds.close()
    raw.close()


def test_streaming_pixels_equal_a_fresh_decode_through_two_workers(
    seaweed: Any, tmp_path: Path
) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 45, opts)
    cache = tmp_path / "cache"
    ds = StreamingDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode="tensor",
        size=24,
        pixel_cache=True,
        world=World(),
        seed=3,
    )
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=24)
    want = {raw[i]["__key__"]: fresh(raw[i]) for i in range(len(raw))}
    for epoch in range(3):
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_collate)
        got = [s for batch in loader for s in batch]
        assert sorted(s["__key__"] for s in got) == sorted(want)
        for s in got:
            assert _equal(s, want[s["__key__"]]), s["__key__"]
    assert _counters(cache).get("px_built") == _parts(m)
    ds.close()
    raw.close()


def test_max_side_bounds_full_size_decodes(seaweed: Any, tmp_path: Path) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    write_images(url, 10, opts)
    cache = tmp_path / "cache"
    ds = ShardedDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode="numpy",
        pixel_cache=PixelCache(max_side=64),
    )
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    for _ in range(2):
        for i in range(len(ds)):
            r = raw[i]
            field = next(f for f in r if f in ("jpg", "jpeg", "png"))
            probe = decode_image(r[field])
            size = 64 if max(probe.size) > 64 else None
            img = decode_image(r[field], size=size, resize="longer")
            want = np.asarray(img)
            got = ds[i][field]
            assert got.shape[:2] == want.shape[:2]
            assert max(got.shape[:2]) <= 64
            assert np.array_equal(got.reshape(want.shape), want)
    ds.close()
    raw.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_images(url, 2, None)
    with pytest.raises(ConfigError, match="pixel_cache needs decode="):
        ShardedDataset(url, pixel_cache=True)
    with pytest.raises(ConfigError, match="max_side"):
        ShardedDataset(url, decode="tensor", size=24, pixel_cache=PixelCache(max_side=64))
    with pytest.raises(ConfigError, match="pixel_cache="):
        ShardedDataset(url, decode="tensor", pixel_cache="yes")
    with pytest.raises(ConfigError, match="max_side"):
        PixelCache(max_side=0)
    with pytest.raises(ConfigError, match="mode"):
        StreamingDataset(url, decode=Decoder(image="numpy", mode=None), pixel_cache=True)


def _corrupt_jpeg() -> bytes:
    good = _encode(_smooth(64, 64, 1), "JPEG")
    return good[: len(good) // 3]  # a valid header, then the data stops


def test_a_corrupt_jpeg_is_never_stored_and_names_shard_and_key(
    seaweed: Any, tmp_path: Path
) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    extra = {
        3: {"__key__": "broken-data", "jpg": _corrupt_jpeg(), "cls": 1},
        7: {"__key__": "broken-head", "jpg": b"\xff\xd8not a jpeg at all", "cls": 2},
    }
    m = write_images(url, 12, opts, shard_size="10MB", extra=extra)
    assert len(m.shards) == 1
    cache = tmp_path / "cache"
    ds = ShardedDataset(
        url, cache_dir=cache, storage_options=opts, decode="tensor", size=24, pixel_cache=True
    )
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=24)
    for _ in range(2):
        for i in range(len(ds)):
            key = raw[i]["__key__"]
            if key.startswith("broken"):
                with pytest.raises(DecodeError) as err:
                    ds[i]
                assert m.shards[0].name in str(err.value)
                assert key in str(err.value)
            else:
                assert _equal(ds[i], fresh(raw[i]))
    assert ds.pixels is not None
    assert ds.pixels.stats["built"] == 1
    # the pixel shard holds no bytes for either bad image
    (entry,) = _pixel_entries(cache)
    data = (cache / "data" / entry.name).read_bytes()
    view = PixelShardView(data, entry.name)
    bad = [view.keys[int(r["sample"])] for r in view.records if int(r["kind"]) == BAD]
    assert sorted(bad) == ["broken-data", "broken-head"]
    assert all(int(r["nbytes"]) == 0 for r in view.records if int(r["kind"]) == BAD)
    ds.close()
    raw.close()


def test_a_cap_too_small_for_pixels_keeps_decoding_warned_once(
    seaweed: Any, tmp_path: Path
) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 30, opts)
    cache = tmp_path / "cache"
    tier = DiskTier(cache)
    # the raw shards and their indexes fit; 224-side pixels of 30 images (~4.5 MB) do not
    cap = tier.metadata_bytes(least=True) + 64 * 1024 + 2 * m.total_bytes
    tier.set_limit(cap)
    tier.close()
    ds = ShardedDataset(
        url, cache_dir=cache, storage_options=opts, decode="tensor", size=224, pixel_cache=True
    )
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=224)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for i in range(len(ds)):
                assert _equal(ds[i], fresh(raw[i]))
    ours = [w for w in caught if "pixel_cache" in str(w.message)]
    assert len(ours) == 1
    assert "cache_limit" in str(ours[0].message)
    assert ds.pixels is not None
    assert ds.pixels.stats["decoded"] == 2 * len(ds)
    assert ds.pixels.stats["hits"] == 0
    assert ds.pixels.stats["no_room"] == _parts(m)
    counters = _counters(cache)
    assert counters.get("px_no_room") == _parts(m)
    assert counters.get("evictions", 0) == 0  # nothing pushed out: no thrash
    assert not _pixel_entries(cache)
    ds.close()
    raw.close()


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run([*UNSHARE, "true"], capture_output=True)
    return done.returncode == 0


def _child(args: list[str], prefix: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "namespaces",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare(1)"),
        ),
    ],
    ids=["processes", "pid-namespaces"],
)
def test_two_processes_fill_the_tier_at_once(
    seaweed: Any, tmp_path: Path, namespaces: bool
) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 60, opts)
    cache = tmp_path / "cache"
    prefix = UNSHARE if namespaces else []
    procs = [
        _child([url, str(cache), json.dumps(opts), str(tmp_path / f"{k}.json")], prefix)
        for k in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    docs = [json.loads((tmp_path / f"{k}.json").read_text()) for k in range(2)]
    for doc in docs:
        assert doc["samples"] == 60
        assert doc["mismatches"] == []
    if namespaces:
        assert [d["pid"] for d in docs] == [1, 1]  # really two PID namespaces
    # each pixel shard written once on the node, whoever wrote it
    assert sum(d["stats"]["built"] for d in docs) == _parts(m)
    assert _counters(cache).get("px_built") == _parts(m)
    assert len(_pixel_entries(cache)) == _parts(m)


def test_sigkill_while_writing_leaves_nothing_served(seaweed: Any, tmp_path: Path) -> None:
    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 80, opts, shard_size="100MB")
    assert len(m.shards) == 1
    cache = tmp_path / "cache"
    args = [url, str(cache), json.dumps(opts), str(tmp_path / "killed.json"), "0"]
    proc = _child(args, [])
    deadline = time.monotonic() + 120
    killed = False
    while proc.poll() is None and time.monotonic() < deadline:
        tmp = cache / "tmp"
        if tmp.is_dir() and any(".px-" in n for n in os.listdir(tmp)):
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.001)
    proc.wait(timeout=60)
    assert killed, "the child finished before its pixel shard was seen being written"
    assert _parts(m) > 1
    ready = sum(e.state.name == "READY" for e in _pixel_entries(cache))
    assert ready < _parts(m)  # the one being written is not served
    tier = DiskTier(cache, sweep=False)
    try:
        assert tier.verify() == []  # whatever is READY is whole
    finally:
        tier.close()
    # the next process serves every sample right, building the shard afresh
    again = _child([*args[:3], str(tmp_path / "again.json"), "0"], [])
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    doc = json.loads((tmp_path / "again.json").read_text())
    assert doc["mismatches"] == []
    assert doc["stats"]["built"] == _parts(m) - ready
    tier = DiskTier(cache, sweep=False)
    try:
        assert tier.verify() == []
        left = tier.leftovers()
        assert left["temp_files"] == []
        assert left["orphan_files"] == []
    finally:
        tier.close()


def test_fastload_dataloader_serves_the_tier_through_workers(seaweed: Any, tmp_path: Path) -> None:
    import fastload

    url, opts = seaweed.new_url("px"), seaweed.storage_options
    m = write_images(url, 40, opts)
    cache = tmp_path / "cache"
    raw = ShardedDataset(url, cache_dir=cache, storage_options=opts)
    fresh = Decoder(image="tensor", size=(24, 24), resize="exact")
    want = {raw[i]["__key__"]: fresh(raw[i]) for i in range(len(raw))}
    ds = StreamingDataset(
        url,
        cache_dir=cache,
        storage_options=opts,
        decode="tensor",
        size=(24, 24),
        pixel_cache=True,
        world=World(),
    )
    assert not ds.batch_transport  # the workers read the pixels themselves
    for epoch in range(2):
        loader = fastload.DataLoader(ds, batch_size=5, num_workers=2)
        loader.set_epoch(epoch)
        seen = 0
        for batch in loader:
            for k, key in enumerate(batch["__key__"]):
                field = next(f for f in ("jpg", "jpeg", "png") if f in want[key])
                assert torch.equal(batch[field][k], want[key][field])
                seen += 1
        assert seen == len(want)
    assert _counters(cache).get("px_built") == _parts(m)
    ds.close()
    raw.close()
