"""Fixtures of the bench tests: a small COCO-style dataset in the session SeaweedFS,
converted to shards, with the original JPEGs beside it for the per-image baseline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.helpers import S3Dataset
from support.seaweed import SeaweedServer


@pytest.fixture(scope="session")
def coco_s3(seaweed: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> S3Dataset:
    """24 synthetic COCO images as shards of ~600 KB in a fresh bucket, plus the raw
    JPEGs under ``.../raw``."""
    from fastload.convert import coco
    from fastload.convert.synthetic import make_coco
    from fastload.storage import open_store

    root = tmp_path_factory.mktemp("bench-coco")
    images, ann = make_coco(root, num_images=24, seed=3)
    bucket = seaweed.new_bucket()
    url, raw = f"s3://{bucket}/coco/train", f"s3://{bucket}/coco/raw"
    report = coco(
        images,
        ann,
        out=url,
        shard_size="600KB",
        storage_options=seaweed.storage_options,
        progress=False,
    )
    store = open_store(raw, seaweed.storage_options)
    for name in sorted(os.listdir(images)):
        store.write_bytes(name, Path(images, name).read_bytes())
    m = report.manifest
    return S3Dataset(
        url, raw, dict(seaweed.storage_options), m.num_samples, m.total_bytes, len(m.shards)
    )
