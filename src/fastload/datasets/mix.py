"""``Mix``: a weighted mixture of fastload datasets, as one iterable dataset.

The mixed stream is :mod:`fastload.sampling.mixture`'s: a fixed, periodic schedule
says which source each position draws from (every source's count within one of its
weight's share in every prefix), each source's items come in its own epoch order
(the shard-windowed shuffle of :mod:`fastload.sampling.order`, one canonical span,
seeded from the mixture's seed and the source's place), and the positions are split
over ranks and DataLoader workers as :class:`~fastload.datasets.planned.PlannedIterable`
splits its units (global steps of ``world_size × batch_size``, round-robin worker
batches). The stream does not depend on the world, so the resume state is the
mixture's ``(seed, epoch, global positions consumed)`` and continues on any world.

The sources are duck-typed, so this module imports nothing of ``fastload.text``: a
token dataset (``window(k)`` and ``unit_counts()``, e.g. :class:`~fastload.TokenDataset`),
an iterable dataset over shards (``unit_counts()`` and ``source.read(i)``, e.g.
:class:`~fastload.StreamingDataset`) or any map-style dataset (``len`` and
``ds[i]``, e.g. :class:`~fastload.ShardedDataset`). Their own seed, epoch, world and
batch settings are not used: the mixture plans for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from fastload.datasets.options import finish
from fastload.datasets.resume import IterableResume
from fastload.errors import ConfigError
from fastload.sampling import (
    DEFAULT_WINDOW_SHARDS,
    SamplerState,
    World,
    epoch_order,
    shard_of,
    worker_indices,
)
from fastload.sampling.mixture import EXHAUSTED_MODES, MixSchedule, rank_positions

__all__ = ["Mix"]

_TAG_SOURCE = 0x4D495853  # keeps the sources' order seeds apart from other streams


class _Member:
    """One source of a mixture: its size, shard layout, order settings and how to
    read its ``k``-th unit (global index in its manifest order)."""

    def __init__(self, dataset: Any, place: int) -> None:
        self.dataset = dataset
        self.place = place
        self.kind = _kind(dataset, place)
        source = getattr(dataset, "source", None)
        sharded = True  # unit k lies in shard shard_of(k, counts) of dataset.source
        if self.kind == "map":
            n = len(dataset)
            counts = getattr(source, "shard_samples", None)
            if counts is None or int(np.sum(counts)) != n:
                counts, sharded = [n], False
        else:
            counts = dataset.unit_counts()
        self.counts = np.asarray(counts, dtype=np.int64)
        self.size = int(self.counts.sum())
        if self.size < 1:
            raise ConfigError(f"Mix: source {place} ({_name(dataset)}) has no items")
        self.shuffle = bool(getattr(dataset, "shuffle", True))
        self.window_shards = int(getattr(dataset, "window_shards", DEFAULT_WINDOW_SHARDS))
        self.prefetchable = sharded and callable(getattr(source, "prefetch", None))

    def settings(self) -> list[Any]:
        """What a saved state must match for this source."""
        return [self.size, self.shuffle, self.window_shards]

    def order(self, seed: int, epoch: int) -> np.ndarray:
        """The source's epoch order (global unit indices) in a mixture seeded ``seed``:
        its own seed comes from the mixture's and its place in the list."""
        words = np.random.SeedSequence([int(seed), _TAG_SOURCE, self.place]).generate_state(2)
        own = int(words[0]) << 31 | int(words[1]) >> 1  # a non-negative 63-bit int
        return epoch_order(
            self.counts, own, epoch, shuffle=self.shuffle, window_shards=self.window_shards
        )

    def get(self, k: int) -> Any:
        """Unit ``k`` of the source as its item."""
        ds = self.dataset
        if self.kind == "window":
            return ds.window(k)
        if self.kind == "shards":
            sample = ds.source.read(k)
            return finish(sample, getattr(ds, "decoder", None), getattr(ds, "transform", None))
        return ds[k]


def _name(dataset: Any) -> str:
    url = getattr(getattr(dataset, "source", None), "url", None)
    return f"{type(dataset).__name__} {url}" if url else type(dataset).__name__


def _kind(dataset: Any, place: int) -> str:
    if callable(getattr(dataset, "window", None)) and callable(
        getattr(dataset, "unit_counts", None)
    ):
        return "window"  # token windows (TokenDataset, ParquetTokenDataset)
    if callable(getattr(dataset, "unit_counts", None)) and callable(
        getattr(getattr(dataset, "source", None), "read", None)
    ):
        return "shards"  # samples of shards (StreamingDataset)
    if not isinstance(dataset, torch.utils.data.IterableDataset) and (
        callable(getattr(dataset, "__getitem__", None))
        and callable(getattr(dataset, "__len__", None))
    ):
        return "map"
    raise TypeError(
        f"Mix: source {place} ({_name(dataset)}) is neither a fastload iterable dataset "
        "(TokenDataset, StreamingDataset) nor a map-style dataset (len and ds[i])"
    )


class Mix(IterableResume, torch.utils.data.IterableDataset[Any]):
    """Items of ``sources`` mixed by ``weights``: one iterable dataset.

    ``weights`` (positive, normalised here; None: equal) fix a periodic schedule in
    which every prefix of T items holds ``T · q_i / K`` items of source i to within
    one, where ``q_i / K`` is the weight (exactly when ``K · w_i`` is whole for some
    period ``K ≤ 10,000``, e.g. 0.5/0.3/0.2 → K = 10; else within ``1 / K``).
    ``period`` overrides K. ``seed`` orders every source (its own shuffle and
    ``window_shards`` are kept; its seed is not used).

    ``exhausted`` says what a source's epoch end does: ``"stop"`` (the default) ends
    the mixture's epoch before the first item that would pass the end of any source,
    so nothing repeats within an epoch; ``"repeat"`` starts that source's next epoch,
    reshuffled, and the mixture's epoch is ``length`` items (default: until every
    source has been drawn whole once). ``length`` with ``"stop"`` shortens the epoch.

    Split over nodes, ranks and DataLoader workers like :class:`~fastload.StreamingDataset`
    (``world`` defaults to :meth:`World.detect`): rank r takes its run of every global
    step of ``world_size × batch_size`` items, so ranks never share an item.
    ``drop_last=False`` keeps the last, partial step, giving the last ranks a short
    batch or none; nothing is repeated to even them out. ``prefetch_shards`` upcoming
    shards of each source download in the background. ``source_field``: add the
    source's index to each (dict) item under this key.

    Resumes exactly under :class:`fastload.DataLoader` (also onto another world size
    with the same global batch) and with torchdata's ``state_dict``/``load_state_dict``.
    Raises :class:`ConfigError` for bad weights or settings, ``TypeError`` for a
    source it cannot index.
    """

    _state_kind = "fastload.mix"
    _state_label = "Mix"

    def __init__(
        self,
        sources: Sequence[Any],
        *,
        weights: Sequence[float] | None = None,
        seed: int = 0,
        exhausted: str = "stop",
        length: int | None = None,
        period: int | None = None,
        world: World | None = None,
        drop_last: bool = False,
        prefetch_shards: int = 2,
        source_field: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
            raise TypeError(f"Mix() takes a list of datasets, got {type(sources).__name__}")
        if not sources:
            raise ConfigError("Mix: give at least one source")
        if weights is None:
            weights = [1.0] * len(sources)
        if len(weights) != len(sources):
            raise ConfigError(f"Mix: {len(weights)} weights for {len(sources)} sources")
        if exhausted not in EXHAUSTED_MODES:
            raise ConfigError(f"Mix: exhausted must be one of {EXHAUSTED_MODES}, got {exhausted!r}")
        if prefetch_shards < 0:
            raise ConfigError(f"Mix: prefetch_shards must be >= 0, got {prefetch_shards}")
        self._state = SamplerState(seed=seed)  # checks the seed
        self.schedule = MixSchedule(weights, period)
        self.members = [_Member(ds, i) for i, ds in enumerate(sources)]
        self.exhausted = exhausted
        sizes = self.sizes
        stop = self.schedule.stop_length(sizes)
        if length is not None:
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ConfigError(f"Mix: length must be a positive int, got {length!r}")
            if exhausted == "stop" and length > stop:
                raise ConfigError(
                    f"Mix: length={length} passes the end of a source (with exhausted='stop' "
                    f"an epoch holds at most {stop} items; use exhausted='repeat')"
                )
        elif exhausted == "stop":
            length = stop
        else:
            length = self.schedule.cover_length(sizes)
        self.length = int(length)
        self.world = world
        self.drop_last = drop_last
        self.prefetch_shards = prefetch_shards
        self.source_field = source_field
        self.batch_size = 1
        self._yielded = self._skip = 0
        self._position: tuple[int, int] = (0, 1)
        self._saved_position: tuple[int, int] | None = None
        self._orders: dict[tuple[int, int, int], np.ndarray] = {}

    # --------------------------------------------------------------- facts
    @property
    def sources(self) -> list[Any]:
        """The mixed datasets, in order."""
        return [m.dataset for m in self.members]

    @property
    def sizes(self) -> list[int]:
        """Items in one epoch of each source."""
        return [m.size for m in self.members]

    @property
    def weights(self) -> list[float]:
        """The normalised weights."""
        return [float(w) for w in self.schedule.weights]

    @property
    def seed(self) -> int:
        """The mixture's seed."""
        return self._state.seed

    @property
    def epoch(self) -> int:
        """The epoch the next iteration plans."""
        return self._state.epoch

    # ------------------------------------------------- the loader's contract
    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` next, from its start."""
        if epoch != self._state.epoch:
            self._state = SamplerState(seed=self._state.seed, epoch=int(epoch))
            self._yielded = self._skip = 0

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None:
        """Set the loader's batch size and the global items already consumed this
        epoch (the loader calls this before each iteration)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._state = dataclasses.replace(self._state, samples_consumed=int(samples_consumed))
        self._yielded = self._skip = 0

    def _world(self) -> World:
        if self.world is None:
            return World.detect()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return self.world.with_worker(info.id, info.num_workers)
        return self.world

    def _resume_started(self) -> SamplerState:
        return self._state

    def _settings(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "period": self.schedule.period,
            "exhausted": self.exhausted,
            "length": self.length,
            "sources": [m.settings() for m in self.members],
        }

    def loader_state(self) -> dict[str, Any]:
        """Seed, epoch and the settings a resume must match."""
        return {"seed": self.seed, "epoch": self.epoch, **self._settings()}

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`loader_state` saved; raises :class:`ConfigError` when the
        state belongs to another mixture (weights, sources, epoch length)."""
        for name, value in self._settings().items():
            if name in state and state[name] != value:
                raise ConfigError(
                    f"Mix state was saved with {name}={state[name]!r}; this mixture has "
                    f"{name}={value!r}"
                )
        self._state = dataclasses.replace(
            self._state,
            seed=int(state["seed"]),
            epoch=int(state.get("epoch", self._state.epoch)),
        )

    # ------------------------------------------------------------- the plan
    def rank_positions(self, world: World | None = None) -> np.ndarray:
        """This rank's remaining positions of the epoch's mixed stream, in order."""
        world = world or self._world()
        return rank_positions(
            self.length,
            self._state.samples_consumed,
            world.world_size,
            world.slot,
            self.batch_size,
            self.drop_last,
        )

    def __len__(self) -> int:
        """Items this rank yields in a whole epoch (all workers together), at the batch
        size the loader configured (1 until then)."""
        world = self._world()
        return int(
            rank_positions(
                self.length, 0, world.world_size, world.slot, self.batch_size, self.drop_last
            ).size
        )

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, unit index in that source)`` of stream positions of this epoch."""
        src, source_epoch, index = self.schedule.locate(
            positions, self.epoch, self.length, self.sizes, self.exhausted
        )
        units = np.empty(src.shape, dtype=np.int64)
        for i in np.unique(src).tolist():
            mine = src == i
            for e in np.unique(source_epoch[mine]).tolist():
                sel = mine & (source_epoch == e)
                units[sel] = self._order(i, e)[index[sel]]
        return src, units

    def _order(self, i: int, epoch: int) -> np.ndarray:
        key = (i, self.seed, epoch)
        order = self._orders.get(key)
        if order is None:
            # keep this source's orders of the latest two epochs (of this seed) only
            stale = [
                k for k in self._orders if k[0] == i and (k[1] != self.seed or k[2] < epoch - 1)
            ]
            for old in stale:
                del self._orders[old]
            order = self._orders[key] = self.members[i].order(self.seed, epoch)
        return order

    def _prefetches(
        self, src: np.ndarray, units: np.ndarray
    ) -> dict[int, list[tuple[int, list[int]]]]:
        """Position in this worker's share -> (source, shards to stage) at the first use
        of each of a source's shards: the next ``prefetch_shards`` new ones."""
        at: dict[int, list[tuple[int, list[int]]]] = {}
        if not self.prefetch_shards:
            return at
        for i, m in enumerate(self.members):
            where = np.flatnonzero(src == i)
            if not m.prefetchable or not where.size:
                continue
            shards = shard_of(units[where], m.counts)
            _, first = np.unique(shards, return_index=True)
            first = np.sort(first)
            order = shards[first]
            for k, p in enumerate(first.tolist()):
                upcoming = order[k + 1 : k + 1 + self.prefetch_shards].tolist()
                if upcoming:
                    at.setdefault(int(where[p]), []).append((i, upcoming))
        return at

    def __iter__(self) -> Iterator[Any]:
        world = self._world()
        skip = self._start_position((world.worker, world.num_workers))
        plan = self.rank_positions(world)
        mine = worker_indices(plan, self.batch_size, world.num_workers, world.worker)
        src, units = self.locate(mine)
        stage = self._prefetches(src, units)
        field = self.source_field
        for pos in range(mine.size):
            for i, shards in stage.get(pos, ()):
                self.members[i].dataset.source.prefetch(shards)
            if pos < skip:
                continue  # yielded before the state was saved
            self._yielded = pos + 1
            i = int(src[pos])
            item = self.members[i].get(int(units[pos]))
            if field is not None and isinstance(item, dict):
                item[field] = i
            yield item

    # ---------------------------------------------------------------- misc
    def io_stats(self) -> dict[str, float]:
        """The sources' I/O counters, summed."""
        out: dict[str, float] = {}
        for m in self.members:
            stats = getattr(m.dataset, "io_stats", None)
            if callable(stats):
                for k, v in stats().items():
                    out[k] = out.get(k, 0.0) + float(v)
        return out

    def close(self) -> None:
        """Close every source that can be closed (its open shards and threads)."""
        for m in self.members:
            close = getattr(m.dataset, "close", None)
            if callable(close):
                close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = {}  # recomputed where it is iterated
        return state

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{_name(m.dataset)}: {w:.3g}" for m, w in zip(self.members, self.weights, strict=True)
        )
        return (
            f"Mix([{parts}], exhausted={self.exhausted!r}, length={self.length}, "
            f"seed={self.seed}, epoch={self.epoch})"
        )
