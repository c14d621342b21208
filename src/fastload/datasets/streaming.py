"""``StreamingDataset``: an iterable over the epoch's plan for this rank and worker.

Each iteration plans the rank's part of the epoch with :mod:`fastload.sampling`
(shards permuted and windowed, samples shuffled within windows, node-contiguous
spans, equal batches per rank), keeps the DataLoader worker's batches (round-robin,
so torch's order over workers is the rank's order), reads samples through the cache
and keeps the next shards of the worker's own plan prefetching.

It implements :class:`fastload.loader.dataloader.ResumableIterable`: with
:class:`fastload.DataLoader` the state ``(seed, epoch, samples consumed)`` resumes
exactly, also onto another world size with the same global batch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch.utils.data

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.options import finish, make_decoder
from fastload.datasets.resume import IterableResume
from fastload.datasets.source import ShardSource, SourceBacked
from fastload.errors import ConfigError
from fastload.sampling import SamplerState, World, plan_from_state, rank_samples, worker_indices
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.sampling.plan import shard_of
from fastload.shards.manifest import Manifest

__all__ = ["StreamingDataset"]


class StreamingDataset(IterableResume, SourceBacked, torch.utils.data.IterableDataset[Any]):
    """Iterate this rank's (and DataLoader worker's) share of the dataset at ``url``.

    ``shuffle``/``seed`` fix the order of every epoch (``set_epoch(e)`` picks the
    epoch); ``window_shards`` is how many shards are shuffled together (more: better
    mixing, more shards open and cached at once). ``world`` defaults to
    :meth:`World.detect` in the iterating process. ``drop_last=False`` ends the
    epoch with a short last batch and pads only so that every rank yields the same
    count (at most world_size - 1 repeated samples, none on one rank: the epoch is
    the dataset, so evaluation counts each sample once); ``True`` drops the
    remainder, keeping full batches. ``prefetch_shards`` upcoming shards of the
    worker's own plan download in the background.

    ``state_dict()``/``load_state_dict()`` follow torchdata's convention: a
    ``torchdata.stateful_dataloader.StatefulDataLoader`` saves each worker's
    position and resumes it exactly (same number of workers).

    Samples are ``{"__key__": str, field: bytes}`` (or decoded/transformed like
    :class:`~fastload.ShardedDataset`'s). Raises like ShardedDataset on a bad dataset.
    """

    _state_kind = "fastload.streaming"
    _state_label = "StreamingDataset"

    @keyword_only("shuffle", "seed", "cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        manifest: Manifest | None = None,
        shuffle: bool = True,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        decode: Any = None,
        size: Any = None,
        transform: Callable[[Any], Any] | None = None,
        max_open_shards: int | None = None,
    ) -> None:
        super().__init__()
        if prefetch_shards < 0:
            raise ConfigError(f"prefetch_shards must be >= 0, got {prefetch_shards}")
        self.source = ShardSource(
            url,
            storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            max_open_shards=(
                max(2, window_shards + prefetch_shards)
                if max_open_shards is None
                else max_open_shards
            ),
            manifest=manifest,
            cache_config=cache_config,
        )
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.window_shards = window_shards
        self.prefetch_shards = prefetch_shards
        self.world = world
        self.decoder = make_decoder(decode, size)
        self.transform = transform
        self.batch_size = 1
        self._state = SamplerState(seed=seed)
        # torchdata-style resume: samples this process's iterator yielded of its own
        # plan, and how many of them the next iterator skips
        self._yielded = 0
        self._skip = 0
        self._position: tuple[int, int] = (0, 1)  # (worker, num_workers) of the plan

    # ------------------------------------------------------------------- plan
    @property
    def seed(self) -> int:
        """The shuffling seed."""
        return self._state.seed

    @property
    def epoch(self) -> int:
        """The epoch the next iteration plans."""
        return self._state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` next (from its start unless :meth:`configure` says
        otherwise)."""
        if epoch != self._state.epoch:
            # the layout is chosen afresh at the epoch's start (SamplerState.started)
            self._state = self._state.next_epoch()
            self._state = dataclasses.replace(self._state, epoch=int(epoch))
            self._yielded = self._skip = 0

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None:
        """Set the loader's batch size and the global samples already consumed this
        epoch (the loader calls this before each iteration)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.drop_last = drop_last
        consumed = int(samples_consumed)
        # at the epoch's start the layout is the iterating world's; mid-epoch, the one
        # recorded (loaded, or chosen when this process started the epoch) is kept
        layout = self._state.canonical_nodes if consumed else None
        self._state = dataclasses.replace(
            self._state, samples_consumed=consumed, canonical_nodes=layout
        )
        self._yielded = self._skip = 0

    def _world(self) -> World:
        if self.world is None:
            return World.detect()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return self.world.with_worker(info.id, info.num_workers)
        return self.world

    def _started(self, world: World) -> SamplerState:
        state = self._state
        if state.canonical_nodes is None:
            # resuming without a saved layout: assume the world that consumed them
            state = dataclasses.replace(state, canonical_nodes=world.num_nodes)
        return state.started(world, self.batch_size, len(self.source))

    def loader_state(self) -> dict[str, Any]:
        """Seed and the epoch's canonical layout, for the loader's ``state_dict``."""
        started = self._started(self._world())
        return {
            "seed": started.seed,
            "epoch": started.epoch,
            "canonical_nodes": started.canonical_nodes,
            "num_samples": len(self.source),
            "shuffle": self.shuffle,
            "window_shards": self.window_shards,
        }

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`loader_state` saved; raises :class:`ConfigError` when the
        state belongs to another dataset layout."""
        n = state.get("num_samples")
        if n is not None and n != len(self.source):
            raise ConfigError(
                f"loader state is for a dataset of {n} samples; {self.source.url} has "
                f"{len(self.source)}"
            )
        for name in ("shuffle", "window_shards"):
            if name in state and state[name] != getattr(self, name):
                raise ConfigError(
                    f"loader state was saved with {name}={state[name]!r}; this dataset has "
                    f"{name}={getattr(self, name)!r}"
                )
        # the epoch too: the loader's set_epoch(that epoch) then keeps the saved layout
        # instead of choosing a new epoch's (a resume in a later epoch onto another world
        # repeated and lost samples before)
        self._state = dataclasses.replace(
            self._state,
            seed=int(state["seed"]),
            epoch=int(state.get("epoch", self._state.epoch)),
            canonical_nodes=state.get("canonical_nodes"),
        )

    def rank_plan(self, world: World | None = None) -> np.ndarray:
        """This rank's remaining global sample indices for the epoch, in loader order."""
        world = world or self._world()
        return plan_from_state(
            self._started(world),
            self.source.shard_samples,
            world,
            self.batch_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            window_shards=self.window_shards,
            pad="ranks",
        )

    def __len__(self) -> int:
        """Samples this rank yields in a whole epoch (all workers together), at the
        batch size the loader configured (1 until then)."""
        world = self._world()
        st = self._started(world)
        return rank_samples(
            len(self.source),
            world.world_size,
            self.batch_size,
            canonical_nodes=st.canonical_nodes or 1,
            drop_last=self.drop_last,
            pad="ranks",
        )

    # ------------------------------------------------- torchdata's convention
    def _resume_started(self) -> SamplerState:
        return self._started(self._world())

    # -------------------------------------------------------------- iterating
    def _positions(self, prefetch: bool = True) -> Iterator[tuple[int, int]]:
        """``(shard, index in shard)`` of this worker's samples, in order, keeping the
        next shards of the worker's plan prefetching (unless ``prefetch`` is False)."""
        world = self._world()
        plan = self.rank_plan(world)
        mine = worker_indices(plan, self.batch_size, world.num_workers, world.worker)
        skip = self._start_position((world.worker, world.num_workers))
        shards = shard_of(mine, self.source.shard_samples)
        starts = self.source._starts
        # the worker's shards in order of first use, and where each is first used: on
        # reaching a new shard, the next few new ones are staged in the background
        _, first = np.unique(shards, return_index=True)
        first = np.sort(first)
        first_use = shards[first]
        at = {int(p): k for k, p in enumerate(first)}
        for pos in range(mine.size):
            k = at.get(pos)
            if k is not None and prefetch and self.prefetch_shards and k + 1 < first_use.size:
                upcoming = first_use[k + 1 : k + 1 + self.prefetch_shards]
                self.source.prefetch([int(s) for s in upcoming])
            if pos < skip:
                continue  # yielded before the state was saved
            s = int(shards[pos])
            self._yielded = pos + 1
            yield s, int(mine[pos] - starts[s])

    def __iter__(self) -> Iterator[Any]:
        for s, j in self._positions():
            yield finish(self.source.read_local(s, j), self.decoder, self.transform)

    def iter_refs(self) -> Iterator[Any]:
        """The same samples as ``iter(self)``, as :class:`~fastload.datasets.source.SampleRef`
        records (where the bytes are) for the loader's batch transport. The loader's
        process prefetches the whole rank's plan in order, so workers do not."""
        for s, j in self._positions(prefetch=False):
            yield self.source.ref_local(s, j)

    @property
    def batch_transport(self) -> bool:
        """Whether :class:`fastload.DataLoader` may build this dataset's batches in its
        own process from the cache (see :meth:`iter_refs`)."""
        return type(self).__iter__ is StreamingDataset.__iter__

    def plan_shards(self) -> tuple[np.ndarray, np.ndarray]:
        """The shards of this rank's remaining plan (all workers) in order of first use,
        and the position in the plan (loader order) where each is first read: what the
        loader prefetches ahead of the workers."""
        shards = shard_of(self.rank_plan(), self.source.shard_samples)
        _, first = np.unique(shards, return_index=True)
        first = np.sort(first)
        return np.asarray(shards[first], dtype=np.int64), first.astype(np.int64)

    def __repr__(self) -> str:
        return (
            f"StreamingDataset({self.source.url!r}, samples={len(self.source)}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )
