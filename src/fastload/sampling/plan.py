"""Partition of an epoch over a :class:`World`, and resume arithmetic.

The unit is the *global step*. With W ranks of batch size B the global batch holds
G = W × B samples; the epoch's order (:mod:`fastload.sampling.order`) is cut into
C canonical spans, and global batch k takes the g = G / C samples
``span_c[s + k*g : s + (k+1)*g]`` of every span c, spans in order (s is the number
of samples already consumed from every span). Physical rank slot r (see
:attr:`World.slot`) takes the contiguous run ``[r*B, (r+1)*B)`` of each global
batch; its samples, batch after batch, are its *rank sequence*.

Invariants (each one tested in ``tests/sampling``):

* **Equal share.** Every rank gets K batches of exactly B samples, so every rank
  takes the same number of steps (uneven ranks hang DDP).
  ``drop_last=True``: K = (N // C - s) // g steps; the last ``N mod G`` samples
  of the epoch order (the tail of each span) are not used this epoch.
  ``drop_last=False``: K = ceil((ceil(N / C) - s) / g); a span shorter than
  K × g is padded by repeating its own samples from its start (cyclically), so
  only pad samples repeat and padding stays on the span's shards. That is
  ``pad="batches"`` (every batch full, as fixed-size consumers need); with
  ``pad="ranks"`` (what :class:`fastload.StreamingDataset` uses) the steps are full
  while every span has g samples left, then one short step takes what the spans
  have left (T samples, spans in order) and every rank takes ``ceil(T / W)`` of it,
  wrapping to its start: at most W - 1 repeats, none on one rank; with
  ``pad="none"`` rank r takes only what is left of its run (no wrap): nothing is
  repeated, and the last ranks may take fewer samples (or none) in that step.
* **Exactly once.** Over an epoch every sample is used exactly once (apart from
  the drop or the pad above), whatever the world.
* **Locality.** When the world has C nodes (the default: C is the world's node
  count when the epoch starts), the ranks of node n take exactly span n, so a node
  touches only span n's shards: ≈ 1/C of the shards (bound in
  :mod:`fastload.sampling.order`), and its ranks share them.
* **Order independent of the world.** The order depends on (seed, epoch, C), not
  on the number of ranks, nodes or workers.
* **Resume.** The state is ``(seed, epoch, samples_consumed)`` plus C, where
  ``samples_consumed`` counts global samples (steps × G, the same on every rank).
  Resuming continues every span at s = samples_consumed / C, so any world whose G
  is a multiple of C continues the epoch with nothing lost or repeated, e.g.
  4 ranks × 6 → 3 ranks × 8, 8 × 4 → 2 × 16, or one node → two nodes. With the
  same world and G the remaining sequence is exactly the suffix of the original.
  A different G also resumes correctly when it is a multiple of C (the remaining
  steps are recomputed from s; the order of the remaining samples changes, their
  set does not). A G that is not a multiple of C, a ``samples_consumed`` that is
  not, or a dataset whose sample count changed mid-epoch raise
  :class:`ConfigError`. C may change freely at an epoch start
  (:meth:`SamplerState.started`).
* **Workers.** torch's DataLoader over an IterableDataset batches inside each
  worker and yields worker batches round-robin, skipping exhausted workers. So
  worker w of W takes the batches j ≡ w (mod W) of the rank sequence
  (:func:`worker_indices`) and the loader's output equals the rank sequence for
  any number of workers.

Map-style datasets use :func:`map_rank_indices`: the same arithmetic with C = 1
over a full pseudo-random permutation (padding repeats from the start of it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastload.errors import ConfigError
from fastload.sampling.order import (
    DEFAULT_WINDOW_SHARDS,
    EpochLayout,
    check_seed,
    permute_positions,
    shard_counts,
    span_bounds,
)
from fastload.sampling.world import World

__all__ = [
    "PAD_MODES",
    "SamplerState",
    "epoch_steps",
    "global_batches",
    "map_rank_indices",
    "plan_from_state",
    "plan_rank",
    "rank_samples",
    "shard_of",
    "shards_in_order",
    "shards_touched",
    "worker_indices",
]

# (span, positions in the span) -> global sample indices
_Take = Callable[[int, np.ndarray], np.ndarray]


#: How ``drop_last=False`` evens out the end of an epoch: ``"batches"`` pads every
#: rank's last batch to the full batch size (fixed-size consumers such as DALI);
#: ``"ranks"`` makes the last global step short and pads only so that every rank
#: gets the same number of samples (at most world_size - 1 repeats; none on one rank);
#: ``"none"`` as ``"ranks"`` without the repeats: the last ranks may get fewer samples.
PAD_MODES = ("batches", "ranks", "none")


@dataclass(frozen=True)
class _Steps:
    steps: int  # remaining full global steps K
    per_span: int  # g = G / C samples per span per step
    consumed_per_span: int  # s
    # pad="ranks": the samples each span has for one last, partial step (() if none)
    tail: tuple[int, ...] = ()
    wrap: bool = True  # pad="ranks" evens the tail's ranks by repeating; "none" does not

    @property
    def total(self) -> int:
        """Global steps left, the partial one included."""
        return self.steps + (1 if self.tail else 0)


def _check_pad(pad: str) -> None:
    if pad not in PAD_MODES:
        raise ConfigError(f"sampling: pad must be one of {PAD_MODES}, got {pad!r}")


def _steps(
    num_samples: int,
    canonical_nodes: int,
    global_batch: int,
    samples_consumed: int,
    drop_last: bool,
    pad: str = "batches",
) -> _Steps:
    if global_batch < 1:
        raise ConfigError(f"sampling: the global batch size must be >= 1, got {global_batch}")
    if canonical_nodes < 1:
        raise ConfigError(f"sampling: canonical_nodes must be >= 1, got {canonical_nodes}")
    if global_batch % canonical_nodes:
        raise ConfigError(
            f"sampling: the global batch size {global_batch} (world size × batch size) is "
            f"not a multiple of the {canonical_nodes} canonical nodes of this epoch's layout; "
            f"resume onto a world whose world_size × batch_size is a multiple of "
            f"{canonical_nodes}, or wait for the next epoch"
        )
    if samples_consumed < 0 or samples_consumed % canonical_nodes:
        raise ConfigError(
            f"sampling: samples_consumed={samples_consumed} must be a non-negative multiple of "
            f"the {canonical_nodes} canonical nodes (it counts whole global steps)"
        )
    if num_samples < 1:
        raise ConfigError("sampling: cannot plan an epoch over a dataset with no samples")
    _check_pad(pad)
    g = global_batch // canonical_nodes
    s = samples_consumed // canonical_nodes
    if drop_last:
        shortest = num_samples // canonical_nodes
        steps = max(0, (shortest - s) // g)
    elif pad in ("ranks", "none"):
        lengths = np.diff(span_bounds(num_samples, canonical_nodes))
        left = np.maximum(lengths - s, 0)
        steps = int(left.min()) // g
        rest = left - steps * g  # each in [0, g]: spans differ in length by at most 1
        tail = tuple(int(r) for r in rest) if int(rest.sum()) else ()
        return _Steps(steps, g, s, tail, wrap=pad == "ranks")
    else:
        longest = -(-num_samples // canonical_nodes)
        steps = max(0, -(-(longest - s) // g))
    return _Steps(steps, g, s)


def epoch_steps(
    num_samples: int,
    global_batch_size: int,
    *,
    canonical_nodes: int = 1,
    drop_last: bool = False,
    samples_consumed: int = 0,
    pad: str = "batches",
) -> int:
    """Number of global steps left in the epoch (every rank takes this many batches;
    with ``pad="ranks"`` the last one may be short).

    Raises :class:`ConfigError` for an impossible layout (see the module docstring).
    """
    return _steps(
        num_samples, canonical_nodes, global_batch_size, samples_consumed, drop_last, pad
    ).total


def rank_samples(
    num_samples: int,
    world_size: int,
    batch_size: int,
    *,
    canonical_nodes: int = 1,
    drop_last: bool = False,
    samples_consumed: int = 0,
    pad: str = "batches",
    slot: int | None = None,
) -> int:
    """Samples every rank takes in the rest of the epoch (the same on every rank):
    ``epoch_steps × batch_size``, less the short last step with ``pad="ranks"``
    (``ceil(T / world_size)`` for the T samples left for it). With ``pad="none"`` the
    ranks may differ: the count of the rank at ``slot`` (default: the most any rank
    takes). Raises like :func:`epoch_steps`."""
    st = _steps(
        num_samples,
        canonical_nodes,
        world_size * batch_size,
        samples_consumed,
        drop_last,
        pad,
    )
    total = sum(st.tail)
    b = -(-total // world_size)
    if st.wrap or slot is None:
        return st.steps * batch_size + b
    return st.steps * batch_size + max(0, min(b, total - slot * b))


def _layout_take(layout: EpochLayout, drop_last: bool) -> _Take:
    def take(c: int, positions: np.ndarray) -> np.ndarray:
        span = layout.span(c)
        if span.size == 0:
            # more canonical nodes than samples: pad from the whole order
            return np.take(layout.order(), positions, mode="wrap")
        if drop_last:
            return span[positions]
        return np.take(span, positions, mode="wrap")

    return take


def _rank_batches(take: _Take, st: _Steps, slot: int, batch_size: int) -> np.ndarray:
    """(K, B) global indices of the rank at ``slot``: its run of every full global
    batch (the partial last step of ``pad="ranks"`` is :func:`_rank_tail`'s)."""
    g = st.per_span
    out = np.empty((st.steps, batch_size), dtype=np.int64)
    if st.steps == 0:
        return out
    q = slot * batch_size + np.arange(batch_size, dtype=np.int64)
    spans, offsets = q // g, q % g
    step_base = st.consumed_per_span + np.arange(st.steps, dtype=np.int64)[:, None] * g
    for c in np.unique(spans).tolist():
        cols = np.flatnonzero(spans == c)
        out[:, cols] = take(c, step_base + offsets[cols][None, :])
    return out


def _rank_tail(take: _Take, st: _Steps, slot: int, world_size: int) -> np.ndarray:
    """The rank's samples of the last, partial global step of ``pad="ranks"``.

    That step holds what every span has left (``st.tail``), spans in order; rank
    slot r takes the run ``[r*b, (r+1)*b)`` of it with ``b = ceil(T / W)``, the
    run wrapping to the step's start for the last ranks (the only repeats)."""
    total = sum(st.tail)
    if not total:
        return np.empty(0, dtype=np.int64)
    b = -(-total // world_size)
    if st.wrap:
        q = (slot * b + np.arange(b, dtype=np.int64)) % total
    else:
        q = np.arange(min(slot * b, total), min((slot + 1) * b, total), dtype=np.int64)
        b = int(q.size)
    ends = np.cumsum(np.asarray(st.tail, dtype=np.int64))
    spans = np.searchsorted(ends, q, side="right")
    offsets = q - (ends[spans] - np.asarray(st.tail, dtype=np.int64)[spans])
    out = np.empty(b, dtype=np.int64)
    base = st.consumed_per_span + st.steps * st.per_span
    for c in np.unique(spans).tolist():
        cols = np.flatnonzero(spans == c)
        out[cols] = take(c, base + offsets[cols])
    return out


def _rank_plan(take: _Take, st: _Steps, slot: int, batch_size: int, world_size: int) -> np.ndarray:
    full = _rank_batches(take, st, slot, batch_size).reshape(-1)
    if not st.tail:
        return full
    return np.concatenate([full, _rank_tail(take, st, slot, world_size)])


def _layout(
    shard_samples: Sequence[int] | np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool,
    window_shards: int,
    canonical_nodes: int,
) -> EpochLayout:
    return EpochLayout(
        shard_samples,
        seed,
        epoch,
        shuffle=shuffle,
        window_shards=window_shards,
        canonical_nodes=canonical_nodes,
    )


def plan_rank(
    shard_samples: Sequence[int] | np.ndarray,
    seed: int,
    epoch: int,
    world: World,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    samples_consumed: int = 0,
    canonical_nodes: int | None = None,
    window_shards: int = DEFAULT_WINDOW_SHARDS,
    pad: str = "batches",
) -> np.ndarray:
    """This rank's remaining global sample indices for the epoch, in loader order.

    ``samples_consumed`` counts global samples already consumed in the epoch (steps
    × world_size × batch_size at save time); ``canonical_nodes`` (default: the
    world's node count) fixes the layout and must be kept for the whole epoch.
    ``pad`` is one of :data:`PAD_MODES` (used with ``drop_last=False``).
    The result has :func:`rank_samples` entries (int64). The rank's
    place is ``world.slot`` (node-major); the worker fields of ``world`` are
    ignored (see :func:`worker_indices`). Only the spans
    this rank reads are computed. Raises :class:`ConfigError` for bad arguments or
    an impossible resume.
    """
    if batch_size < 1:
        raise ConfigError(f"sampling: batch_size must be >= 1, got {batch_size}")
    c = world.num_nodes if canonical_nodes is None else canonical_nodes
    layout = _layout(shard_samples, seed, epoch, shuffle, window_shards, c)
    st = _steps(
        layout.num_samples, c, world.world_size * batch_size, samples_consumed, drop_last, pad
    )
    take = _layout_take(layout, drop_last)
    return _rank_plan(take, st, world.slot, batch_size, world.world_size)


def global_batches(
    shard_samples: Sequence[int] | np.ndarray,
    seed: int,
    epoch: int,
    global_batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    samples_consumed: int = 0,
    canonical_nodes: int = 1,
    window_shards: int = DEFAULT_WINDOW_SHARDS,
) -> np.ndarray:
    """Every remaining global batch of the epoch as a (steps, G) int64 array.

    Row k is global step k; rank slot r of a world with batch size B reads columns
    ``r*B .. r*B + B - 1``. Raises :class:`ConfigError` like :func:`plan_rank`.
    """
    layout = _layout(shard_samples, seed, epoch, shuffle, window_shards, canonical_nodes)
    st = _steps(layout.num_samples, canonical_nodes, global_batch_size, samples_consumed, drop_last)
    layout.order()  # all spans in one vectorised pass
    take = _layout_take(layout, drop_last)
    positions = st.consumed_per_span + np.arange(st.steps * st.per_span, dtype=np.int64)
    parts = [take(c, positions).reshape(st.steps, st.per_span) for c in range(canonical_nodes)]
    return np.concatenate(parts, axis=1)


def worker_indices(
    rank_plan: np.ndarray, batch_size: int, num_workers: int, worker: int
) -> np.ndarray:
    """The part of a rank sequence that DataLoader worker ``worker`` yields.

    The rank sequence is cut into batches of ``batch_size`` (the last may be short);
    the worker takes batches j with j ≡ worker (mod num_workers), in order. A torch
    DataLoader with ``batch_size`` and ``num_workers`` over an IterableDataset that
    yields these then produces exactly ``rank_plan`` (a DataLoader with
    ``num_workers=0`` is one worker). Raises :class:`ConfigError` on bad arguments.
    """
    if batch_size < 1:
        raise ConfigError(f"sampling: batch_size must be >= 1, got {batch_size}")
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ConfigError(
            f"sampling: worker {worker} must lie in 0..num_workers-1 (num_workers={num_workers})"
        )
    plan = np.asarray(rank_plan).reshape(-1)
    full = plan.size // batch_size
    parts = [plan[: full * batch_size].reshape(full, batch_size)[worker::num_workers].reshape(-1)]
    if plan.size % batch_size and full % num_workers == worker:
        parts.append(plan[full * batch_size :])
    return np.concatenate(parts)


def shard_of(indices: np.ndarray, shard_samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """Manifest shard number of every global sample index (vectorised)."""
    counts = shard_counts(shard_samples)
    ends = np.cumsum(counts)
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= (ends[-1] if ends.size else 0)):
        raise ConfigError("sampling: sample index outside the dataset")
    return np.searchsorted(ends, idx, side="right").astype(np.int64)


def shards_touched(indices: np.ndarray, shard_samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """Sorted manifest numbers of the shards that ``indices`` read from."""
    return np.unique(shard_of(indices, shard_samples))


def shards_in_order(indices: np.ndarray, shard_samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """Manifest numbers of the shards that ``indices`` read, in order of first use
    (what a prefetcher should fetch, in that order)."""
    shards = shard_of(indices, shard_samples)
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)]


def map_rank_indices(
    num_samples: int,
    seed: int,
    epoch: int,
    world: World,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    samples_consumed: int = 0,
    pad: str = "batches",
) -> np.ndarray:
    """This rank's remaining sample indices for a map-style dataset, in order.

    The epoch order is a pseudo-random permutation of ``0..num_samples-1`` keyed by
    (seed, epoch) (identity without ``shuffle``); global batch k is positions
    ``samples_consumed + k*G ..`` and the rank takes its run of B. Padding
    (``drop_last=False``) repeats the order from its start, to full batches or,
    with ``pad="ranks"``, only to equal ranks. Costs O(share of this rank).
    Raises :class:`ConfigError` on bad arguments.
    """
    if batch_size < 1:
        raise ConfigError(f"sampling: batch_size must be >= 1, got {batch_size}")
    check_seed(seed, epoch)
    st = _steps(num_samples, 1, world.world_size * batch_size, samples_consumed, drop_last, pad)

    def take(_c: int, positions: np.ndarray) -> np.ndarray:
        flat = positions.reshape(-1) % num_samples
        mapped = permute_positions(flat, num_samples, seed, epoch) if shuffle else flat
        return mapped.reshape(positions.shape)

    return _rank_plan(take, st, world.slot, batch_size, world.world_size)


_OPTIONAL_STATE_FIELDS = ("canonical_nodes", "global_batch_size", "num_samples")


@dataclass(frozen=True)
class SamplerState:
    """Where an epoch stands: JSON-serialisable, versioned, the same on every rank.

    ``samples_consumed`` counts global samples (global steps × global batch size);
    ``canonical_nodes`` is the epoch's layout (None until the epoch starts: then
    the world's node count is used); ``global_batch_size`` and ``num_samples`` are
    recorded to check a resume. Raises :class:`ConfigError` on bad values.
    """

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "fastload.sampler"

    seed: int = 0
    epoch: int = 0
    samples_consumed: int = 0
    canonical_nodes: int | None = None
    global_batch_size: int | None = None
    num_samples: int | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _OPTIONAL_STATE_FIELDS:
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise ConfigError(f"SamplerState.{f.name} must be an int, got {value!r}")
            object.__setattr__(self, f.name, int(value))  # numpy ints would not be JSON
        check_seed(self.seed, self.epoch)
        if self.samples_consumed < 0:
            raise ConfigError(
                f"SamplerState.samples_consumed must be >= 0, got {self.samples_consumed}"
            )
        for name in _OPTIONAL_STATE_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"SamplerState.{name} must be a positive int, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with ``kind`` and ``version``."""
        return {"kind": self.KIND, "version": self.VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplerState:
        """Rebuild a state written by :meth:`to_dict`; raises :class:`ConfigError` on
        another kind, an unknown version or unknown fields."""
        if data.get("kind") != cls.KIND:
            raise ConfigError(
                f"sampler state: expected kind {cls.KIND!r}, got {data.get('kind')!r}"
            )
        if data.get("version") != cls.VERSION:
            raise ConfigError(
                f"sampler state: version {data.get('version')!r} is not supported "
                f"(this fastload reads version {cls.VERSION})"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names - {"kind", "version"}
        if unknown:
            raise ConfigError(f"sampler state: unknown fields {sorted(unknown)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def started(
        self,
        world: World,
        batch_size: int,
        num_samples: int,
        canonical_nodes: int | None = None,
    ) -> SamplerState:
        """This state with the epoch's layout fixed: at an epoch start the layout is
        ``canonical_nodes`` or the world's node count; mid-epoch the recorded one is
        kept. Records the global batch size and the sample count."""
        c = self.canonical_nodes
        if self.samples_consumed == 0:
            c = canonical_nodes if canonical_nodes is not None else world.num_nodes
        return dataclasses.replace(
            self,
            canonical_nodes=c,
            global_batch_size=world.world_size * batch_size,
            num_samples=num_samples,
        )

    def advanced(self, steps: int, global_batch_size: int) -> SamplerState:
        """The state after ``steps`` more global steps of ``global_batch_size``."""
        return dataclasses.replace(
            self,
            samples_consumed=self.samples_consumed + steps * global_batch_size,
            global_batch_size=global_batch_size,
        )

    def next_epoch(self) -> SamplerState:
        """The state at the start of the next epoch (layout chosen afresh)."""
        return dataclasses.replace(
            self, epoch=self.epoch + 1, samples_consumed=0, canonical_nodes=None
        )


def plan_from_state(
    state: SamplerState,
    shard_samples: Sequence[int] | np.ndarray,
    world: World,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    window_shards: int = DEFAULT_WINDOW_SHARDS,
    pad: str = "batches",
) -> np.ndarray:
    """:func:`plan_rank` for the epoch and position recorded in ``state``.

    Raises :class:`ConfigError` when the resume is impossible: the dataset's sample
    count differs from the recorded one mid-epoch, the state has consumed samples
    but no layout, or the new global batch is not a multiple of the layout's nodes.
    """
    counts = shard_counts(shard_samples)
    n = int(counts.sum())
    if state.samples_consumed:
        if state.canonical_nodes is None:
            raise ConfigError(
                f"sampler state: {state.samples_consumed} samples consumed in epoch "
                f"{state.epoch} but no canonical_nodes recorded; cannot resume"
            )
        if state.num_samples is not None and state.num_samples != n:
            raise ConfigError(
                f"sampler state: epoch {state.epoch} was planned over {state.num_samples} "
                f"samples but the dataset now has {n}; cannot resume mid-epoch"
            )
    c = state.canonical_nodes if state.canonical_nodes is not None else world.num_nodes
    return plan_rank(
        counts,
        state.seed,
        state.epoch,
        world,
        batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        samples_consumed=state.samples_consumed,
        canonical_nodes=c,
        window_shards=window_shards,
        pad=pad,
    )
