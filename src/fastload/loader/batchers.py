"""What builds a :class:`~fastload.DataLoader`'s batches, made from its
:class:`~fastload.loader.transport_plan.TransportPlan`.

* :func:`build_batchers`: the :class:`~fastload.loader.token_batches.TokenBatcher`
  (token datasets), the :class:`~fastload.loader.pixel_batches.PixelBatcher` (a
  dataset's stored pixels), or the batch transport's
  :class:`~fastload.loader.transport.BatchBuilder` with its decoders, and the
  shared tier its worker processes read through (:mod:`fastload.loader.shared_tier`);
* :func:`collate_for`: the collate torch's loader runs;
* per epoch, :func:`shard_prefetcher` (the epoch's shards staged ahead of the
  workers) and :func:`build_batches` (the builder fed with the epoch's
  ``RefBatch`` records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from fastload.config import default_workers
from fastload.loader.pixel_batches import PixelBatcher
from fastload.loader.shared_tier import lend_shared_tier
from fastload.loader.token_batches import TokenBatcher
from fastload.loader.transport import BatchBuilder, PlanPrefetcher, collate_decoded, collate_refs
from fastload.loader.transport_plan import TransportPlan, builds_items, loader_decoder

__all__ = [
    "BUILD_DEPTH",
    "Batchers",
    "build_batchers",
    "build_batches",
    "collate_for",
    "default_decode_threads",
    "shard_prefetcher",
]

#: Batches built ahead of the caller by the batch transport's builder thread.
BUILD_DEPTH = 2


def default_decode_threads() -> int:
    """The loader's decode threads when ``decode_threads`` is None: one per usable CPU
    core (the affinity mask), at most 8 (:func:`fastload.config.default_workers`)."""
    return default_workers("loader")


def collate_for(plan: TransportPlan, given: Callable[..., Any] | None) -> Any:
    """The collate torch's loader runs under ``plan`` (``given``: the caller's)."""
    if plan.collate == "refs":
        return collate_refs
    if plan.collate == "decoded":
        return collate_decoded
    if plan.collate == "default":
        # torch's default_collate, after a check that names the field and the sizes
        # when arrays of different shapes meet (torch's own error does not)
        from fastload.datasets.collate import default_collate

        return default_collate
    return given


def shard_prefetcher(
    dataset: Any, rank_indices: np.ndarray | None, *, batch_size: int, batches_ahead: int
) -> PlanPrefetcher | None:
    """The cache transport's schedule for one epoch: the epoch's shards in order of
    first use, staged from the loader's process ahead of the workers (one schedule
    per rank; the tier's single flight makes it one download per node).
    ``rank_indices``: a map-style dataset's indices for this rank (what torch's
    sampler iterates), None for an iterable dataset (which plans its own shards).
    None when prefetching is switched off on the dataset or its cache config."""
    source = dataset.source
    ahead = int(source.cache_config.prefetch_shards)
    if getattr(dataset, "prefetch_shards", None) == 0 or not ahead:
        return None
    if rank_indices is not None:
        shards = np.searchsorted(source._starts, rank_indices, side="right") - 1
        _, first = np.unique(shards, return_index=True)
        first = np.sort(first)
        order, first_pos = shards[first], first
    else:
        order, first_pos = dataset.plan_shards()
    return PlanPrefetcher(
        source,
        order.tolist(),
        ahead,
        first_batch=(np.asarray(first_pos) // batch_size).tolist(),
        batches_ahead=batches_ahead,
    )


class Batchers(NamedTuple):
    """What builds batches in the loader's process under a plan (each None when it
    does not apply): the token batcher, or the batch transport's builder and the
    shared tier its worker processes read through (its path and the finalizer that
    ends it); and the pixel batcher of epochs whose pixels are all stored."""

    tokens: TokenBatcher | None = None
    builder: BatchBuilder | None = None
    shared_dir: str | None = None
    finalizer: Any = None
    pixels: PixelBatcher | None = None


def build_batchers(
    plan: TransportPlan,
    dataset: Any,
    *,
    owner: object,
    device: torch.device | None,
    collate_fn: Callable[..., Any] | None,
    decode_threads: int | None,
) -> Batchers:
    """Build the :class:`Batchers` of ``plan`` for the loader ``owner`` (the shared
    tier lives as long as it does)."""
    cuda = device if device is not None and device.type == "cuda" else None
    if plan.batches == "tokens":
        tokens = TokenBatcher(dataset)
        tokens.pin, tokens.device = plan.pinned_batches, cuda
        return Batchers(tokens=tokens)
    if plan.pixel_batches:
        # epochs of stored pixels, built here (loader/pixel_batches.py)
        pin = plan.pin_memory and torch.cuda.is_available()
        return Batchers(pixels=PixelBatcher(dataset, pin=pin, device=cuda))
    if plan.batches != "refs":
        return Batchers()
    source = dataset.source
    decoder: Any = loader_decoder(dataset)
    batch_decoder: Any = None
    if plan.nvjpeg:
        # raw JPEG bytes packed (pinned), decoded whole on the loader's device
        batch_decoder, decoder = decoder.batch_decoder(device), None
    shared_dir, finalizer = lend_shared_tier(owner, source) if plan.shared_tier else (None, None)
    if collate_fn is None and builds_items(dataset):
        # built items batch as on torch's path (collate_for's "default")
        from fastload.datasets.collate import default_collate

        collate_fn = default_collate
    builder = BatchBuilder(
        source,
        decoder=decoder,
        collate_fn=collate_fn,
        threads=decode_threads or default_decode_threads(),
        pin=plan.pinned_batches,
        batch_decoder=batch_decoder,
        device=cuda,
    )
    return Batchers(None, builder, shared_dir, finalizer)


def build_batches(
    builder: BatchBuilder,
    refs: Iterator[Any],
    prefetch: PlanPrefetcher | None,
    *,
    worker_processes: int,
) -> Iterator[Any]:
    """The batches ``builder`` builds from an epoch's ``RefBatch`` records, with
    ``prefetch`` (started here, closed when the records end) told of each one."""
    if prefetch is not None:
        prefetch.start()

    def noted() -> Iterator[Any]:
        try:
            for rb in refs:
                if prefetch is not None:
                    prefetch.advance()
                yield rb
        finally:
            if prefetch is not None:
                prefetch.close()

    # without worker processes this process plans too: on a planner thread, one
    # batch ahead of the builder's copy
    return builder.iterate(noted(), depth=BUILD_DEPTH, pull_in_thread=worker_processes == 0)
