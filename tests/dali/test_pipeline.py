"""fastload.dali on the CPU: both ways of feeding DALI give Pillow's pixels and the
right dataset indices."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.errors import ConfigError
from fastload.sampling import World

pytestmark = pytest.mark.dali
pytest.importorskip("nvidia.dali")  # the dali extra is part of the test install

N = 37


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    h, w = 40 + (i % 5) * 8, 56 + (i % 3) * 8
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 4 + i * 9) % 256, (yy * 5) % 256, (xx + yy + i) % 256], -1)
    img = np.clip(img + rng.integers(-8, 8, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[bytes]]:
    root = tmp_path_factory.mktemp("dali") / "ds"
    images = [_jpeg(i) for i in range(N)]
    with fastload.ShardWriter(str(root), shard_size="16KB") as w:
        for i, b in enumerate(images):
            w.write({"__key__": f"img{i:04d}", "jpg": b, "cls": i})
    return str(root), images


def _pil(b: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    img = Image.open(io.BytesIO(b)).convert("RGB")
    if size is not None:
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    return np.asarray(img)


@pytest.mark.parametrize("py_workers", [0, 1])
def test_external_source_matches_pillow_and_the_plan(
    dataset: tuple[str, list[bytes]], tmp_path: Path, py_workers: int
) -> None:
    url, images = dataset
    pipe = fastload.dali.pipeline(
        url,
        batch_size=4,
        device="cpu",
        seed=3,
        world=World.single(),
        cache_dir=tmp_path / "cache",
        py_workers=py_workers,
        drop_last=False,
    )
    seen: list[int] = []
    for batch in pipe:
        assert isinstance(batch["images"], list)
        for img, i in zip(batch["images"], batch["index"].tolist(), strict=True):
            ref = _pil(images[i])
            got = img.numpy()
            assert got.shape == ref.shape
            assert np.abs(got.astype(int) - ref.astype(int)).max() <= 2
            seen.append(i)
    assert sorted(set(seen)) == list(range(N))
    ds = fastload.StreamingDataset(url, seed=3, world=World.single(), drop_last=False)
    ds.configure(batch_size=4, drop_last=False, samples_consumed=0)
    plan = list(ds.rank_plan())  # the same sampler as the datasets: StreamingDataset
    # pads only to equal ranks, DALI's batches stay full (pad="batches"), so the
    # pipeline's extra tail repeats samples of the plan
    assert seen[: len(plan)] == plan
    assert len(seen) % 4 == 0
    assert set(seen[len(plan) :]) <= set(plan)
    pipe.close()


def test_external_source_resize_and_resume(dataset: tuple[str, list[bytes]]) -> None:
    url, _ = dataset
    full = fastload.dali.pipeline(
        url, batch_size=4, size=(32, 48), seed=1, world=World.single(), py_workers=0
    )
    batches = [b["index"].tolist() for b in full]
    assert len(batches) == N // 4 == len(batches)  # drop_last by default
    first = fastload.dali.pipeline(
        url, batch_size=4, size=(32, 48), seed=1, world=World.single(), py_workers=0
    )
    it = iter(first)
    head = [next(it) for _ in range(3)]
    assert head[0]["images"].shape == (4, 32, 48, 3)
    state = first.state_dict()
    resumed = fastload.dali.pipeline(
        url, batch_size=4, size=(32, 48), seed=1, world=World.single(), py_workers=0
    )
    resumed.load_state_dict(state)
    rest = [b["index"].tolist() for b in resumed]
    assert [b["index"].tolist() for b in head] + rest == batches


def test_dali_webdataset_reader_over_the_cache(
    dataset: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    url, images = dataset
    seen: list[int] = []
    for rank in range(2):
        world = World.of(rank, 2)
        pipe = fastload.dali.pipeline(
            url,
            batch_size=5,
            source="reader",
            shuffle=False,
            cache_dir=tmp_path / "cache",
            world=world,
            size=24,
        )
        for batch in pipe:
            assert batch["images"].shape[1:] == (24, 24, 3)
            for img, i in zip(batch["images"], batch["index"].tolist(), strict=True):
                ref = _pil(images[i], (24, 24))
                assert np.abs(img.numpy().astype(int) - ref.astype(int)).mean() < 12
                seen.append(i)
        pipe.close()
    # DALI splits samples into contiguous per-rank parts; drop_last drops each tail
    assert len(seen) == len(set(seen))
    assert len(seen) == 2 * ((N // 2) // 5) * 5


def test_bad_arguments(dataset: tuple[str, list[bytes]]) -> None:
    url, _ = dataset
    with pytest.raises(ConfigError, match="cache_dir"):
        fastload.dali.pipeline(url, batch_size=4, source="reader")
    with pytest.raises(ConfigError, match="device"):
        fastload.dali.pipeline(url, batch_size=4, device="tpu")
    with pytest.raises(ConfigError, match="no field"):
        fastload.dali.pipeline(url, batch_size=4, field="png")


def test_set_epoch_replans_even_after_a_break(dataset: tuple[str, list[bytes]]) -> None:
    url, _ = dataset
    pipe = fastload.dali.pipeline(
        url, batch_size=4, size=16, seed=2, world=World.single(), py_workers=0
    )
    it = iter(pipe)
    next(it)  # stop mid-epoch 0
    pipe.set_epoch(1)
    epoch1 = [i for b in pipe for i in b["index"].tolist()]
    ds = fastload.StreamingDataset(url, seed=2, world=World.single(), drop_last=True)
    ds.configure(batch_size=4, drop_last=True, samples_consumed=0)
    ds.set_epoch(1)
    assert epoch1 == list(ds.rank_plan())
    ds.set_epoch(0)
    assert epoch1 != list(ds.rank_plan())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("size", [None, (32, 48)])
def test_gpu_outputs_stay_on_the_gpu(dataset: tuple[str, list[bytes]], size: Any) -> None:
    url, images = dataset
    pipe = fastload.dali.pipeline(
        url, batch_size=4, device="gpu", size=size, seed=0, world=World.single(), py_workers=0
    )
    assert pipe.device_id == torch.cuda.current_device()
    batch = next(iter(pipe))
    imgs = batch["images"]
    for k, i in enumerate(batch["index"].tolist()):
        img = imgs[k]
        assert img.is_cuda  # never copied back through the host
        ref = _pil(images[i], size)
        got = img.cpu().numpy()
        assert got.shape == ref.shape
        assert np.abs(got.astype(int) - ref.astype(int)).mean() < (3 if size is None else 12)
    pipe.close()
