"""The planned-iterable core that fastload's iterable datasets share.

An iterable dataset over shards is a sequence of *units* (an image sample, a token
window, …) each belonging to one shard. Everything about *which* units this rank and
DataLoader worker read, in what order, and where a resumed run continues is the same
whatever a unit is: :class:`PlannedIterable` holds it once —

- the plan: the epoch's shard-windowed shuffle, the node/rank/worker split and the
  padding policy of :mod:`fastload.sampling` (``rank_plan``, ``len``);
- ``set_epoch`` and the loader's ``configure`` (batch size, samples consumed);
- the resume state: ``loader_state``/``load_loader_state`` for
  :class:`fastload.DataLoader`, and torchdata's ``state_dict``/``load_state_dict``
  through :class:`~fastload.datasets.resume.IterableResume`;
- the walk over this worker's share (:meth:`PlannedIterable.plan_units`), keeping the
  next shards of the worker's own plan prefetching.

A dataset plugs its item loading into it: it says how many units each shard holds
(:meth:`PlannedIterable.unit_counts`) and turns ``(shard, unit)`` into an item in its
own ``__iter__``. :class:`~fastload.StreamingDataset` (samples) and
:class:`~fastload.TokenDataset` (token windows) are the two today.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch.utils.data

from fastload.datasets.resume import IterableResume
from fastload.datasets.source import ShardSource, SourceBacked
from fastload.errors import ConfigError
from fastload.sampling import SamplerState, World, plan_from_state, rank_samples, worker_indices
from fastload.sampling.plan import shard_of

__all__ = ["PlannedIterable"]


class PlannedIterable(IterableResume, SourceBacked, torch.utils.data.IterableDataset[Any]):
    """Plan, split, padding, resume state and ``set_epoch`` of an iterable dataset
    over the shards of ``self.source`` (a base class: see the module docstring).

    A subclass calls :meth:`_init_plan` from its ``__init__`` (after setting
    ``self.source``), defines :meth:`unit_counts`, and iterates
    :meth:`plan_units`. Class attributes: ``_pad``, the epoch's padding policy
    (``"ranks"``: every rank yields the same count, the last batch may be short;
    ``"batches"``: whole batches, the epoch padded by repeating units), and
    ``_state_kind``/``_state_label`` for the resume state.
    """

    #: padding policy of the epoch's end (``pad`` of :func:`fastload.sampling.plan_rank`)
    _pad: ClassVar[str] = "batches"

    source: ShardSource

    def _init_plan(
        self,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        window_shards: int,
        prefetch_shards: int,
        world: World | None,
    ) -> None:
        """Set the plan's arguments and an empty iteration state."""
        if prefetch_shards < 0:
            raise ConfigError(f"prefetch_shards must be >= 0, got {prefetch_shards}")
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.window_shards = window_shards
        self.prefetch_shards = prefetch_shards
        self.world = world
        self.batch_size = 1
        self._state = SamplerState(seed=seed)
        # torchdata-style resume: units this process's iterator yielded of its own
        # plan, how many of them the next iterator skips, and which worker it is
        self._yielded = self._skip = 0
        self._position: tuple[int, int] = (0, 1)  # (worker, num_workers) of the plan
        self._saved_position: tuple[int, int] | None = None

    # ------------------------------------------------------ what a unit is
    def unit_counts(self) -> Sequence[int] | np.ndarray:
        """How many units each shard holds (the units of shard ``s`` follow those of
        shard ``s - 1`` in the global numbering). Each dataset defines it."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its units are")

    @property
    def num_units(self) -> int:
        """Units in the whole dataset."""
        return int(np.sum(np.asarray(self.unit_counts(), dtype=np.int64)))

    def _state_extra(self) -> dict[str, Any]:
        """Settings besides ``shuffle`` and ``window_shards`` that a saved state must
        match (a subclass adds its own, e.g. ``seq_len``)."""
        return {}

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
            self._state = dataclasses.replace(self._state.next_epoch(), epoch=int(epoch))
            self._yielded = self._skip = 0

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None:
        """Set the loader's batch size and the global units already consumed this
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
        return state.started(world, self.batch_size, self.num_units)

    def _resume_started(self) -> SamplerState:
        return self._started(self._world()) if self.num_units else self._state

    def rank_plan(self, world: World | None = None) -> np.ndarray:
        """This rank's remaining global unit indices for the epoch, in loader order."""
        world = world or self._world()
        if not self.num_units:
            return np.zeros(0, dtype=np.int64)
        return plan_from_state(
            self._started(world),
            self.unit_counts(),
            world,
            self.batch_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            window_shards=self.window_shards,
            pad=self._pad,
        )

    def __len__(self) -> int:
        """Units this rank yields in a whole epoch (all workers together), at the
        batch size the loader configured (1 until then)."""
        n = self.num_units
        if not n:
            return 0
        world = self._world()
        st = self._started(world)
        return rank_samples(
            n,
            world.world_size,
            self.batch_size,
            canonical_nodes=st.canonical_nodes or 1,
            drop_last=self.drop_last,
            pad=self._pad,
        )

    # ------------------------------------------------------------ resume state
    def loader_state(self) -> dict[str, Any]:
        """Seed, epoch and the epoch's canonical layout, and the settings a resume
        must match, for the loader's ``state_dict``."""
        world = self._world()
        started = self._resume_started()
        return {
            "seed": started.seed,
            "epoch": started.epoch,
            "canonical_nodes": started.canonical_nodes or world.num_nodes,
            "num_samples": self.num_units,
            "shuffle": self.shuffle,
            "window_shards": self.window_shards,
            **self._state_extra(),
        }

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`loader_state` saved; raises :class:`ConfigError` when the
        state belongs to another dataset layout or other settings."""
        mine = {
            "num_samples": self.num_units,
            "shuffle": self.shuffle,
            "window_shards": self.window_shards,
            **self._state_extra(),
        }
        for name, value in mine.items():
            if name in state and state[name] != value:
                message = (
                    f"loader state was saved with {name}={state[name]!r}; this "
                    f"{self._state_label} ({self.source.url}) has {name}={value!r}"
                )
                if name == "num_samples":
                    message += f" (the state is for a dataset of {state[name]} samples)"
                raise ConfigError(message)
        # the epoch too: the loader's set_epoch(that epoch) then keeps the saved layout
        # instead of choosing a new epoch's (a resume in a later epoch onto another world
        # repeated and lost samples before)
        self._state = dataclasses.replace(
            self._state,
            seed=int(state["seed"]),
            epoch=int(state.get("epoch", self._state.epoch)),
            canonical_nodes=state.get("canonical_nodes"),
        )

    # -------------------------------------------------------------- iterating
    def plan_units(self, prefetch: bool = True) -> Iterator[tuple[int, int]]:
        """``(shard, global unit index)`` of this worker's units, in order, resuming
        after the units a loaded state had yielded, and keeping the next
        ``prefetch_shards`` shards of the worker's plan prefetching (unless
        ``prefetch`` is False)."""
        world = self._world()
        plan = self.rank_plan(world)
        skip = self._start_position((world.worker, world.num_workers))
        if not plan.size:
            return
        mine = worker_indices(plan, self.batch_size, world.num_workers, world.worker)
        shards = shard_of(mine, self.unit_counts())
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
            self._yielded = pos + 1
            yield int(shards[pos]), int(mine[pos])

    def plan_shards(self) -> tuple[np.ndarray, np.ndarray]:
        """The shards of this rank's remaining plan (all workers) in order of first use,
        and the position in the plan (loader order) where each is first read: what the
        loader prefetches ahead of the workers."""
        shards = shard_of(self.rank_plan(), self.unit_counts())
        _, first = np.unique(shards, return_index=True)
        first = np.sort(first)
        return np.asarray(shards[first], dtype=np.int64), first.astype(np.int64)
