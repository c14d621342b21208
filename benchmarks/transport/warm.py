"""Section ``warm``: raw bytes, shards in a warm ``cache_dir``; fastload's loader
(cache and pickle transports) against torch's DataLoader over the same
``ShardedDataset`` and webdataset's documented ``WebLoader`` pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils.data

import fastload
from _epoch_common import Epoch
from transport.data import Ctx
from transport.epochs import close_loader, goal_lines, run_variants

WDS_SHUFFLE = 1000  # webdataset's sample shuffle buffer (per worker)


def wds_loader(urls: list[str], bs: int, nw: int) -> Any:
    """webdataset's documented shuffled pipeline over ``urls``, raw samples batched
    in the workers (``batched``), the WebLoader not re-batching."""
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(WDS_SHUFFLE)
        .batched(bs)
    )
    return wds.WebLoader(ds, num_workers=nw, batch_size=None)


def section_warm(ctx: Ctx) -> dict[str, Any]:
    """Every warm variant in interleaved rounds: results, ratios, goal lines (>= 3x)."""
    bs, nw, url, cache, m = ctx.bs, ctx.nw, ctx.url, ctx.cache, ctx.manifest
    urls = [str(ctx.shards_dir / s.name) for s in m.shards]

    def torch_sharded() -> Epoch:
        ds = fastload.ShardedDataset(url, cache_dir=cache, manifest=m)
        try:
            return ctx.epoch(
                lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True)
            )
        finally:
            ds.close()

    def fl(kind: str, transport: str, workers: int | None = None) -> Callable[[], Epoch]:
        def run() -> Epoch:
            if kind == "sharded":
                ds: Any = fastload.ShardedDataset(url, cache_dir=cache, manifest=m)
                kw: dict[str, Any] = {"shuffle": True}
            else:
                ds = fastload.StreamingDataset(url, shuffle=True, cache_dir=cache, manifest=m)
                kw = {}
            n = nw if workers is None else workers
            return ctx.epoch(
                lambda: fastload.DataLoader(
                    ds, batch_size=bs, num_workers=n, transport=transport, **kw
                ),
                after=close_loader,
            )

        return run

    variants = {
        "torch_sharded": torch_sharded,
        "wds_local": lambda: ctx.epoch(lambda: wds_loader(urls, bs, nw)),
        "fl_sharded": fl("sharded", "auto"),
        "fl_stream": fl("stream", "auto"),
        "fl_sharded_pickle": fl("sharded", "pickle"),
        "fl_stream_pickle": fl("stream", "pickle"),
        # context: the cache transport needs no worker process for raw batches
        "fl_sharded_0w": fl("sharded", "auto", 0),
    }
    pairs = [
        ("fl_sharded", "torch_sharded"),
        ("fl_stream", "torch_sharded"),
        ("fl_sharded", "wds_local"),
        ("fl_stream", "wds_local"),
        ("fl_sharded_pickle", "torch_sharded"),
        ("fl_stream_pickle", "torch_sharded"),
        ("fl_sharded_pickle", "wds_local"),
        ("fl_stream_pickle", "wds_local"),
        ("wds_local", "torch_sharded"),
        ("fl_sharded_0w", "torch_sharded"),
        ("fl_sharded_0w", "wds_local"),
    ]
    out = run_variants(ctx, variants, pairs)
    out["goals"] = goal_lines(out["ratios"], [(f"{c}/{b}", 3.0) for c, b in pairs[:4]])
    return out
