"""The data set every section shares: ``--images`` COCO-sized JPEGs as an image
folder, converted into ``--shard-size`` shards on local disk, their keys, and a warm
``cache_dir`` over them (:class:`Ctx`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastload
from _epoch_common import Epoch, make_image_folder, time_epoch
from transport.epochs import Tally, tally_facts


def dataset_keys(url: str, **kw: Any) -> set[str]:
    """Every sample key of the data set at ``url`` (from the shard indexes)."""
    ds = fastload.ShardedDataset(url, **kw)
    try:
        return {ds.source.ref(i).key for i in range(len(ds))}
    finally:
        ds.close()


class Ctx:
    """What the sections share: arguments, paths, the data set and its keys."""

    def __init__(self, args: argparse.Namespace, work: Path, count: int | None = None) -> None:
        self.args = args
        self.work = work
        self.bs, self.nw = args.batch_size, args.workers
        paths = make_image_folder(work / "images", args.images)[: args.images]
        images = work / "images"
        if count is not None and count < len(paths):
            # the first ``count`` images as a folder of their own (hard links)
            images = work / f"images-first-{count}"
            for p in paths[:count]:
                link = images / p.relative_to(work / "images")
                if not link.exists():
                    link.parent.mkdir(parents=True, exist_ok=True)
                    os.link(p, link)
            paths = paths[:count]
        self.paths = paths
        tag = f"{len(paths)}-{args.shard_size}"
        self.shards_dir = work / f"shards-{tag}"
        if not (self.shards_dir / "manifest.json").is_file():
            fastload.convert.folder(
                images,
                str(self.shards_dir),
                shard_size=args.shard_size,
                progress=False,
                overwrite=True,
            )
        self.url = str(self.shards_dir)
        self.manifest = fastload.Manifest.load(self.url)
        self.n = self.manifest.num_samples
        if self.n != len(self.paths):
            raise AssertionError(f"shards hold {self.n} samples, not {len(self.paths)}")
        self.mean_bytes = sum(p.stat().st_size for p in self.paths) / self.n
        self.keys = dataset_keys(self.url, manifest=self.manifest)
        self.cache = work / f"cache-warm-{tag}"
        self._fresh = iter(range(10**9))
        # warm the NVMe cache (and the page cache)
        warm = fastload.ShardedDataset(self.url, cache_dir=self.cache, manifest=self.manifest)
        for s in range(len(self.manifest.shards)):
            warm.source.shard(s)
        warm.close()

    def fresh_dir(self, what: str) -> Path:
        return self.work / f"{what}-{os.getpid()}-{next(self._fresh)}"

    def epoch(
        self,
        make: Callable[[], Any],
        keyed: bool = True,
        after: Callable[[Any], dict[str, Any]] | None = None,
    ) -> Epoch:
        """Time one epoch of the loader ``make()`` builds (wrapped in a Tally)."""

        def probe(t: Tally) -> dict[str, Any]:
            facts = tally_facts(t, self.keys if keyed else None)
            if after is not None:
                facts.update(after(t.loader))
            return facts

        return time_epoch(lambda: Tally(make()), probe)
