"""A CropDecoder's epoch follows the dataset's ``set_epoch`` into DataLoader workers,
persistent ones included: each epoch's draws in the workers equal the dataset's own
items for that epoch, and two epochs draw differently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import fastload
from fastload import ShardedDataset, StreamingDataset
from fastload.decode import CropDecoder, RandomResizedCrop
from fastload.shards.writer import ShardWriter

from .images import encode, photo_like


def _write(url: str, n: int = 10) -> None:
    with ShardWriter(url, shard_size="60KB") as w:
        for i in range(n):
            w.write(
                {
                    "__key__": f"img{i:04d}",
                    "jpg": encode(photo_like(160 + 8 * i, 120, seed=i), "JPEG", quality=90),
                }
            )


def _own(ds: Any, epoch: int) -> dict[str, Any]:
    """The dataset's own items of ``epoch``, by key, in this process."""
    ds.set_epoch(epoch)
    items = ds if isinstance(ds, StreamingDataset) else (ds[i] for i in range(len(ds)))
    return {s["__key__"]: s for s in items}


def _check_epochs(got: dict[int, dict[str, Any]], want: dict[int, dict[str, Any]]) -> None:
    for epoch in (0, 1):
        assert set(got[epoch]) == set(want[epoch])
        for key, item in want[epoch].items():
            assert got[epoch][key]["__crop__"] == item["__crop__"], (epoch, key)
            assert torch.equal(got[epoch][key]["jpg"], item["jpg"])
    crops = [{k: s["__crop__"] for k, s in got[e].items()} for e in (0, 1)]
    assert crops[0] != crops[1]


def test_streaming_set_epoch_reaches_persistent_workers(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _write(url)
    dec = CropDecoder(RandomResizedCrop(), size=(32, 32), seed=7)
    ds = StreamingDataset(url, cache_dir=tmp_path / "cache", decode=dec, shuffle=True)
    loader = fastload.DataLoader(
        ds, batch_size=3, num_workers=2, persistent_workers=True, collate_fn=list
    )
    got: dict[int, dict[str, Any]] = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got[epoch] = {s["__key__"]: s for b in loader for s in b}
    loader.close()
    check = StreamingDataset(url, cache_dir=tmp_path / "cache", decode=dec, shuffle=True)
    _check_epochs(got, {e: _own(check, e) for e in (0, 1)})
    # the dataset's set_epoch moved its decoder along
    assert check.decoder.epoch == 1
    ds.close()
    check.close()


def test_sharded_set_epoch_reaches_persistent_workers(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _write(url)
    dec = CropDecoder(RandomResizedCrop(), size=(32, 32), seed=7)
    ds = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=2, persistent_workers=True, collate_fn=list
    )
    got: dict[int, dict[str, Any]] = {}
    for epoch in (0, 1):
        ds.set_epoch(epoch)  # beside the sampler's set_epoch, as in torch's recipes
        got[epoch] = {s["__key__"]: s for b in loader for s in b}
    del loader
    check = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    _check_epochs(got, {e: _own(check, e) for e in (0, 1)})
    ds.close()
    check.close()


def test_fastload_dataloader_drives_a_map_style_datasets_epoch(tmp_path: Path) -> None:
    """No ds.set_epoch by the caller: fastload.DataLoader's epochs (its own advance
    from one epoch to the next) reach the crop decoder in persistent workers."""
    url = str(tmp_path / "ds")
    _write(url)
    dec = CropDecoder(RandomResizedCrop(), size=(32, 32), seed=7)
    ds = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    loader = fastload.DataLoader(
        ds, batch_size=3, num_workers=2, persistent_workers=True, collate_fn=list
    )
    got: dict[int, dict[str, Any]] = {}
    for epoch in (0, 1):
        got[epoch] = {s["__key__"]: s for b in loader for s in b}
    loader.close()
    check = ShardedDataset(url, cache_dir=tmp_path / "cache", decode=dec)
    _check_epochs(got, {e: _own(check, e) for e in (0, 1)})
    ds.close()
    check.close()
