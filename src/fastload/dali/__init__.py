"""DALI pipelines fed from fastload's cache (needs the ``dali`` extra).

``fastload.dali.pipeline(url, batch_size=..., device="cpu"|"gpu", ...)`` returns an
iterable of ``{"images": ..., "index": ...}`` batches; see
:class:`~fastload.dali._pipeline.DaliPipeline`. DALI itself is imported on first use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastload._args import keyword_only
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS

if TYPE_CHECKING:  # pragma: no cover
    from fastload.config import CacheConfig, FetchConfig
    from fastload.dali._pipeline import DaliPipeline
    from fastload.sampling import World

__all__ = ["DaliPipeline", "pipeline"]


@keyword_only("batch_size", "device")
def pipeline(
    url: str,
    *,
    batch_size: int,
    device: str = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    ram_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache_config: CacheConfig | None = None,
    fetch: FetchConfig | None = None,
    shuffle: bool = True,
    seed: int = 0,
    world: World | None = None,
    drop_last: bool = True,
    window_shards: int = DEFAULT_WINDOW_SHARDS,
    size: int | tuple[int, int] | None = None,
    source: str = "external",
    field: str | None = None,
    num_threads: int = 2,
    py_workers: int = 1,
    py_start_method: str = "spawn",
    device_id: int | None = None,
    prefetch_queue_depth: int = 2,
) -> DaliPipeline:
    """Build a :class:`~fastload.dali._pipeline.DaliPipeline` over the dataset at
    ``url`` (every argument is passed to it unchanged; see its docstring)."""
    from fastload.dali._pipeline import DaliPipeline

    return DaliPipeline(
        url,
        batch_size=batch_size,
        device=device,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        ram_limit=ram_limit,
        storage_options=storage_options,
        cache_config=cache_config,
        fetch=fetch,
        shuffle=shuffle,
        seed=seed,
        world=world,
        drop_last=drop_last,
        window_shards=window_shards,
        size=size,
        source=source,
        field=field,
        num_threads=num_threads,
        py_workers=py_workers,
        py_start_method=py_start_method,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
    )


def __getattr__(name: str) -> Any:
    if name == "DaliPipeline":
        from fastload.dali._pipeline import DaliPipeline

        return DaliPipeline
    raise AttributeError(f"module 'fastload.dali' has no attribute {name!r}")
