"""Images of different sizes meeting the default collate: a ConfigError that says why."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from PIL import Image

import fastload
from fastload.datasets.collate import check_same_shapes, default_collate
from fastload.errors import ConfigError


def _jpeg(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB").save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def mixed_sizes(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("mixed") / "shards")
    with fastload.ShardWriter(out, shard_size="1MB") as writer:
        for i, (w, h) in enumerate([(64, 48), (64, 48), (48, 64), (80, 40)]):
            writer.write({"__key__": f"{i:04d}", "jpg": _jpeg(w, h, i), "cls": i})
    return out


def test_same_shapes_collate_as_torch() -> None:
    samples = [{"jpg": torch.full((3, 4, 5), i), "cls": i, "txt": "x"} for i in range(3)]
    check_same_shapes(samples)
    got = default_collate(samples)
    want = torch.utils.data.default_collate(samples)
    assert torch.equal(got["jpg"], want["jpg"])
    assert torch.equal(got["cls"], want["cls"])


def test_names_the_field_the_shapes_and_the_fix() -> None:
    samples: list[Any] = [
        ({"img": np.zeros((3, 8, 8))}, 0),
        ({"img": np.zeros((3, 8, 8))}, 1),
        ({"img": np.zeros((3, 8, 11))}, 2),
    ]
    with pytest.raises(ConfigError) as info:
        check_same_shapes(samples)
    msg = str(info.value)
    assert "[0]['img']" in msg
    assert "(3, 8, 8)" in msg
    assert "(3, 8, 11)" in msg
    assert "item 2 of the batch" in msg
    assert "size=(height, width)" in msg


@pytest.mark.parametrize("workers", [0, 2])
def test_decode_with_a_shorter_side_then_default_collate(mixed_sizes: str, workers: int) -> None:
    ds: Any = fastload.ShardedDataset(mixed_sizes, decode="tensor", size=32)
    with pytest.raises(RuntimeError):  # what torch says alone: no field, no fix
        list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers))
    loader: Any = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=workers, collate_fn=default_collate
    )
    with pytest.raises(ConfigError, match=r"cannot batch \['jpg'\]: sample '0000' has shape"):
        list(loader)
    exact: Any = fastload.ShardedDataset(mixed_sizes, decode="tensor", size=(32, 32))
    (batch,) = list(
        torch.utils.data.DataLoader(
            exact, batch_size=4, num_workers=workers, collate_fn=default_collate
        )
    )
    assert tuple(batch["jpg"].shape) == (4, 3, 32, 32)


def test_one_sample_or_none_has_nothing_to_compare() -> None:
    check_same_shapes([])
    check_same_shapes([{"a": np.zeros(2)}])


class _MixedSizes(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"img": torch.zeros(3, 8, 8 + i % 2), "cls": i}


def test_fastload_loader_collates_with_the_check() -> None:
    from fastload.sampling import World

    loader = fastload.DataLoader(_MixedSizes(), batch_size=4, world=World.single())
    assert loader.transport == "pickle"
    with pytest.raises(ConfigError, match=r"\['img'\]: a sample has shape \(3, 8, 8\)"):
        list(loader)
    same = fastload.DataLoader(_MixedSizes(), batch_size=2, shuffle=False, world=World.single())
    with pytest.raises(ConfigError):  # items 0 and 1 already differ
        next(iter(same))


class _Images(torch.utils.data.Dataset[Any]):
    """Item i: a CHW view of an HWC uint8 image filled with i (as decode="tensor" gives)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        hwc = torch.full((5, 4, 3), i, dtype=torch.uint8)
        hwc[0, 0] = torch.tensor([i, 100 + i, 200 + i], dtype=torch.uint8)
        return {"__key__": f"{i:02d}", "img": hwc.permute(2, 0, 1), "cls": i}


def test_shared_batch_buffer_is_shared_memory() -> None:
    from fastload.loader.transport import _shared

    buf = _shared((2, 5, 4, 3))
    assert buf.is_shared()
    assert tuple(buf.shape) == (2, 5, 4, 3)
    assert buf.dtype == torch.uint8
    assert buf.is_contiguous()
    assert buf.untyped_storage().nbytes() == 2 * 5 * 4 * 3
    buf[1, 2] = 9
    assert int(buf.sum()) == 9 * 4 * 3


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_collate_decoded_in_workers_stacks_channels_last(context: str) -> None:
    from fastload.loader.transport import collate_decoded

    loader = torch.utils.data.DataLoader(
        _Images(),
        batch_size=3,
        num_workers=1,
        collate_fn=collate_decoded,
        multiprocessing_context=context,
    )
    batches = list(loader)
    assert [b["__key__"] for b in batches] == [["00", "01", "02"], ["03", "04", "05"]]
    for b, first in zip(batches, (0, 3), strict=True):
        img = b["img"]
        assert tuple(img.shape) == (3, 3, 5, 4)
        assert img.is_contiguous(memory_format=torch.channels_last)
        assert img.is_shared()  # built in the worker's shared memory, not pickled
        for k in range(3):
            i = first + k
            assert torch.equal(img[k], _Images()[i]["img"])
        assert b["cls"].tolist() == [first, first + 1, first + 2]
