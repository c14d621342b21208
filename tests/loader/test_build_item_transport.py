"""The cache transport for datasets that build their own items from raw samples
(:class:`fastload.loader.BatchTransportDataset`: ``batch_transport``, ``source``,
``build_item``), as fastload's drop-ins do, over a COCO set converted onto SeaweedFS:
raw bytes move as for ShardedDataset, ``build_item`` runs in the loader's process, the
batches equal torch's path's; I/O counters come from the dataset's ``source``."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from PIL import Image

from fastload import convert
from fastload.convert.synthetic import make_coco
from fastload.datasets.source import ShardSource
from fastload.loader import BatchTransportDataset, DataLoader

from .reference_samplers import GroupedBatchSampler

N = 18
BATCH = 3


class CocoItems(torch.utils.data.Dataset[tuple[torch.Tensor, dict[str, Any]]]):
    """A detection dataset following the protocol: item ``i`` is ``(CHW uint8 image,
    {"image_id", "annotations", "built_in": pid of the process that built it})``."""

    batch_transport = True

    def __init__(self, url: str, storage_options: dict[str, Any], cache_dir: Any = None) -> None:
        self.source = ShardSource(url, storage_options=storage_options, cache_dir=cache_dir)

    def __len__(self) -> int:
        return len(self.source)

    def build_item(self, sample: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        doc = json.loads(sample["json"])
        field = next(k for k in sample if k not in ("json", "__key__"))
        with Image.open(io.BytesIO(sample[field])) as img:
            pixels = np.asarray(img.convert("RGB")).copy()
        image = torch.from_numpy(pixels).permute(2, 0, 1)
        target = {"image_id": doc["image"]["id"], "annotations": doc["annotations"]}
        return image, {**target, "built_in": os.getpid()}

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.build_item(self.source.read(i))


def detection_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))


@pytest.fixture(scope="module")
def coco_url(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    base = tmp_path_factory.mktemp("coco-items")
    images, ann = make_coco(base / "src", num_images=N, size=(48, 40), seed=4)
    url: str = seaweed.new_url("coco")
    convert.coco(
        images, ann, url, shard_size="12KB", progress=False,
        storage_options=seaweed.storage_options,
    )  # fmt: skip
    return url


def grouped() -> GroupedBatchSampler:
    base = torch.utils.data.DistributedSampler(range(N), num_replicas=1, rank=0, seed=2)
    return GroupedBatchSampler(base, [i % 2 for i in range(N)], BATCH)


def flatten(batches: list[tuple[Any, ...]]) -> list[tuple[torch.Tensor, dict[str, Any]]]:
    out = []
    for images, targets in batches:
        out += list(zip(images, targets, strict=True))
    return out


def same_items(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    left, right = flatten(a), flatten(b)
    assert len(left) == len(right)
    for (img, tgt), (ref_img, ref_tgt) in zip(left, right, strict=True):
        assert torch.equal(img, ref_img)
        assert {k: v for k, v in tgt.items() if k != "built_in"} == {
            k: v for k, v in ref_tgt.items() if k != "built_in"
        }


@pytest.mark.s3
@pytest.mark.parametrize("workers", [0, 2])
def test_cache_transport_builds_items_in_the_loaders_process(
    seaweed: Any, coco_url: str, tmp_path: Path, workers: int
) -> None:
    opts = seaweed.storage_options
    ds = CocoItems(coco_url, opts, cache_dir=tmp_path / "cache")
    assert isinstance(ds, BatchTransportDataset)
    assert len(ds.source.manifest.shards) > 2
    loader = DataLoader(
        ds, batch_sampler=grouped(), transport="cache", collate_fn=detection_collate,
        num_workers=workers, plan_in_workers=workers > 0,
    )  # fmt: skip
    assert (loader.transport, loader.worker_processes) == ("cache", workers)
    assert loader.transport_plan.builder_decodes
    reference = torch.utils.data.DataLoader(
        CocoItems(coco_url, opts), batch_sampler=grouped(), collate_fn=detection_collate
    )
    for epoch in range(2):
        loader.set_epoch(epoch)  # passed on to the DistributedSampler
        got = list(loader)
        reference.batch_sampler.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        same_items(got, list(reference))
        # built where the batch was built: this process, not a worker
        assert {t["built_in"] for _, t in flatten(got)} == {os.getpid()}
    assert loader._builder is not None
    assert loader._builder.stats.decoded == 2 * N
    stats = loader.stats()
    assert stats.samples == 2 * N  # images, not channels
    assert stats.io["remote_bytes"] > 0
    assert stats.cache_hit_ratio is not None
    assert stats.io["cache_misses"] > 0
    loader.close()
    ds.source.close()


@pytest.mark.s3
def test_cache_transport_resumes_a_batch_sampler_exactly(seaweed: Any, coco_url: str) -> None:
    def make() -> DataLoader:
        ds = CocoItems(coco_url, seaweed.storage_options)
        return DataLoader(
            ds, batch_sampler=grouped(), transport="cache", collate_fn=detection_collate
        )

    full = list(make())
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    second = make()
    second.load_state_dict(state)
    rest = list(second)
    same_items(head + rest, full)
    assert len(full) == N // BATCH
    for lo in (first, second):
        lo.close()


@pytest.mark.s3
@pytest.mark.parametrize("workers", [0, 2])
def test_auto_keeps_item_building_on_torchs_path_with_io_stats(
    seaweed: Any, coco_url: str, workers: int
) -> None:
    ds = CocoItems(coco_url, seaweed.storage_options)
    assert not hasattr(ds, "io_stats")  # counters come from its source
    fresh = CocoItems(coco_url, seaweed.storage_options)
    subset = torch.utils.data.Subset(fresh, list(range(N)))  # found through the wrapper
    for dataset in (ds, subset):
        loader = DataLoader(
            dataset, batch_size=4, collate_fn=detection_collate, num_workers=workers
        )
        assert loader.transport == "pickle"
        if dataset is ds:
            assert "build_item" in loader.transport_plan.why
        items = flatten(list(loader))
        assert len(items) == N
        if workers:
            assert os.getpid() not in {t["built_in"] for _, t in items}
        stats = loader.stats()
        assert stats.samples == N
        assert stats.io["remote_bytes"] > 0
        assert stats.cache_hit_ratio is not None
        loader.close()
    ds.source.close()
    fresh.source.close()


class CocoCounts(CocoItems):
    """Items of one shape: ``{"image_id": int, "objects": int}``."""

    def build_item(self, sample: Any) -> Any:  # type: ignore[override]
        doc = json.loads(sample["json"])
        return {"image_id": doc["image"]["id"], "objects": len(doc["annotations"])}


@pytest.mark.s3
def test_built_items_batch_with_the_default_collate_as_on_torchs_path(
    seaweed: Any, coco_url: str
) -> None:
    opts = seaweed.storage_options
    batches = {}
    for transport in ("cache", "pickle"):
        ds = CocoCounts(coco_url, opts)
        loader = DataLoader(ds, batch_size=4, shuffle=True, seed=3, transport=transport)
        assert loader.transport == transport
        batches[transport] = list(loader)
        loader.close()
        ds.source.close()
    assert len(batches["cache"]) == len(batches["pickle"]) == -(-N // 4)
    for got, ref in zip(batches["cache"], batches["pickle"], strict=True):
        assert set(got) == {"image_id", "objects"}
        for name in got:
            assert torch.equal(got[name], ref[name])
