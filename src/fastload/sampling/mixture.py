"""A weighted mixture of several sources: which source each position of the mixed
stream draws from, and which item of that source it is. Pure arithmetic, no I/O.

**The schedule.** The weights are turned into integer *quotas* ``q_i`` of a
*period* ``K`` (``sum(q_i) == K``): the smallest ``K`` (up to :data:`MAX_PERIOD`) for
which every ``K * w_i`` is a whole number, else ``K = MAX_PERIOD`` with the quotas
apportioned by largest remainder (each within 1 of ``K * w_i``). One period is laid
out once, earliest deadline first: the ``j``-th item (1-based) of source ``i`` may
take a slot in ``[floor((j-1) K / q_i), ceil(j K / q_i))`` and each slot goes to the
released item with the earliest deadline (ties to the lowest source), which meets
every deadline (the proportionate-fair schedule of one processor); the mixed stream
repeats that period. So:

* every run of ``K`` positions starting at a multiple of ``K`` holds exactly
  ``q_i`` items of source ``i``;
* every prefix of ``T`` positions holds ``T * q_i / K`` items of source ``i`` to
  within one (``|c_i(T) - T q_i / K| < 1``; ``tests/sampling/test_mixture.py``
  checks it for every prefix of many random weightings);
* with exact weights (``K * w_i`` whole) that is ``T * w_i`` to within one; otherwise
  ``q_i / K`` is within ``1 / K`` of ``w_i``.

Position ``t`` is source ``block[t % K]``, its ``(t // K) * q_i + prefix[t % K, i]``-th
item: constant time per position, so a rank finds its own positions anywhere in the
stream without walking the stream before them.

**Epochs.** The sources' items are drawn in each source's own epoch order. With
``exhausted="stop"`` the mixture's epoch ``e`` ends just before the first draw that
would take an item past the end of some source's epoch ``e`` (no item repeats in
an epoch; the other sources' remaining items are not used that epoch). With
``exhausted="repeat"`` a source that runs out starts its next epoch (reshuffled)
and the mixture's epoch ends after ``length`` items (default: when every source has
been drawn whole at least once); source ``i`` goes through its epochs back to back
over the mixture's epochs, its ``k``-th draw overall being item ``k mod n_i`` of
its epoch ``k // n_i``, so no item repeats within one of its epochs.

**The split** (:func:`rank_positions`) is :mod:`fastload.sampling.plan`'s: global
step ``k`` takes positions ``[start + k*G, start + (k+1)*G)`` with ``G = W × B``, and
rank slot ``r`` takes the run ``[r*B, (r+1)*B)`` of it; the split over DataLoader
workers is :func:`fastload.sampling.worker_indices`. The stream does not depend on
the world, so a resume at global position ``start`` continues it on any world.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import isfinite

import numpy as np

from fastload.errors import ConfigError

__all__ = ["EXHAUSTED_MODES", "LONGEST_PERIOD", "MAX_PERIOD", "MixSchedule", "rank_positions"]

#: The longest period chosen for the weights (see the module docstring).
MAX_PERIOD = 10_000
#: The longest period one may ask for (a period is laid out slot by slot, once).
LONGEST_PERIOD = 1_000_000
_NEVER = np.iinfo(np.int64).max
#: What happens when a source's epoch runs out: see the module docstring.
EXHAUSTED_MODES = ("stop", "repeat")


def _weights(weights: Sequence[float]) -> np.ndarray:
    values = list(weights)
    if not values:
        raise ConfigError("mixture: weights must name at least one source")
    for w in values:
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ConfigError(f"mixture: weights must be numbers, got {w!r}")
        if not isfinite(float(w)) or float(w) <= 0:
            raise ConfigError(f"mixture: every weight must be positive and finite, got {w!r}")
    arr = np.asarray(values, dtype=np.float64)
    return arr / arr.sum()


def _quotas(w: np.ndarray, period: int | None) -> tuple[int, np.ndarray]:
    """``(K, q)``: the period and the integer quotas (see the module docstring)."""
    if period is None:
        ks = np.arange(1, MAX_PERIOD + 1, dtype=np.float64)[:, None]
        scaled = ks * w[None, :]
        exact = np.all(np.abs(scaled - np.rint(scaled)) <= 1e-9 * ks, axis=1)
        hits = np.flatnonzero(exact)
        period = int(hits[0]) + 1 if hits.size else MAX_PERIOD
    elif (
        isinstance(period, bool)
        or not isinstance(period, (int, np.integer))
        or not 1 <= period <= LONGEST_PERIOD
    ):
        raise ConfigError(f"mixture: period must be an int in 1..{LONGEST_PERIOD}, got {period!r}")
    k = int(period)
    ideal = k * w
    q = np.floor(ideal + 1e-9).astype(np.int64)
    short = k - int(q.sum())
    if short > 0:  # largest remainder, ties to the lowest index
        order = np.argsort(-(ideal - q), kind="stable")
        q[order[:short]] += 1
    if (q == 0).any():
        small = [int(i) for i in np.flatnonzero(q == 0)]
        raise ConfigError(
            f"mixture: the weights of sources {small} are too small to draw even once in a "
            f"period of {k} items; raise them (or the period)"
        )
    return k, q


class MixSchedule:
    """The mixed stream's schedule for ``weights`` (positive; normalised here) and
    ``period`` (None: chosen as the module docstring says).

    Attributes: ``weights`` (normalised), ``period`` K, ``quotas`` (int64, sum K),
    ``block`` (the source of each position of a period) and ``prefix`` (``prefix[j,
    i]``: draws of source i in the first j positions of a period). Raises
    :class:`ConfigError` for a bad weight or period.
    """

    def __init__(self, weights: Sequence[float], period: int | None = None) -> None:
        self.weights = _weights(weights)
        self.period, self.quotas = _quotas(self.weights, period)
        k, q = self.period, self.quotas
        n = q.size
        block = np.empty(k, dtype=np.int64)
        drawn = np.zeros(n, dtype=np.int64)
        prefix = np.zeros((k + 1, n), dtype=np.int64)
        for t in range(k):
            # the next item of source i is due in slots [floor(c*K/q), ceil((c+1)*K/q))
            released = (drawn * k) // q <= t
            deadline = np.where(released & (drawn < q), -((-(drawn + 1) * k) // q), _NEVER)
            i = int(np.argmin(deadline))  # earliest deadline first, ties to the lowest index
            block[t] = i
            drawn[i] += 1
            prefix[t + 1] = drawn
        self.block = block
        self.prefix = prefix
        # where the j-th draw of source i lies within a period
        self._slots = [np.flatnonzero(block == i) for i in range(n)]

    @property
    def num_sources(self) -> int:
        """How many sources the schedule mixes."""
        return int(self.quotas.size)

    def sources(self, positions: np.ndarray) -> np.ndarray:
        """The source each position of the stream draws from (int64, vectorised)."""
        return self.block[np.asarray(positions, dtype=np.int64) % self.period]

    def draws(self, positions: np.ndarray) -> np.ndarray:
        """How many earlier positions draw from the same source as each position: its
        index in that source's stream of draws (int64, vectorised)."""
        t = np.asarray(positions, dtype=np.int64)
        r = t % self.period
        src = self.block[r]
        return (t // self.period) * self.quotas[src] + self.prefix[r, src]

    def counts(self, total: int) -> np.ndarray:
        """Items of each source in the first ``total`` positions (int64 per source)."""
        full, r = divmod(int(total), self.period)
        return full * self.quotas + self.prefix[r]

    def position_of(self, source: int, draw: int) -> int:
        """The stream position of source ``source``'s ``draw``-th item (0-based)."""
        full, j = divmod(int(draw), int(self.quotas[source]))
        return full * self.period + int(self._slots[source][j])

    def stop_length(self, sizes: Sequence[int]) -> int:
        """Positions before the first draw past the end of a source of ``sizes[i]``
        items (``exhausted="stop"``)."""
        return min(self.position_of(i, int(n)) for i, n in enumerate(self._sizes(sizes)))

    def cover_length(self, sizes: Sequence[int]) -> int:
        """Positions until every source has been drawn whole at least once (the
        default epoch of ``exhausted="repeat"``)."""
        return max(self.position_of(i, int(n) - 1) + 1 for i, n in enumerate(self._sizes(sizes)))

    def _sizes(self, sizes: Sequence[int]) -> list[int]:
        out = [int(n) for n in sizes]
        if len(out) != self.num_sources:
            raise ConfigError(
                f"mixture: {len(out)} source sizes for a schedule of {self.num_sources} sources"
            )
        empty = [i for i, n in enumerate(out) if n < 1]
        if empty:
            raise ConfigError(f"mixture: sources {empty} have no items")
        return out

    def locate(
        self,
        positions: np.ndarray,
        epoch: int,
        length: int,
        sizes: Sequence[int],
        exhausted: str,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, source epoch, index in that source's epoch order)`` of each
        position of the mixture's epoch ``epoch`` of ``length`` positions (vectorised).

        ``"stop"``: source epoch = ``epoch``, index = the draw (``length`` must not
        pass :meth:`stop_length`). ``"repeat"``: source ``i`` continues across the
        mixture's epochs, its ``k``-th draw overall being item ``k mod n_i`` of its
        epoch ``k // n_i``. Raises :class:`ConfigError` on a bad mode or length."""
        if exhausted not in EXHAUSTED_MODES:
            raise ConfigError(
                f"mixture: exhausted must be one of {EXHAUSTED_MODES}, got {exhausted!r}"
            )
        n = np.asarray(self._sizes(sizes), dtype=np.int64)
        pos = np.asarray(positions, dtype=np.int64)
        src = self.sources(pos)
        k = self.draws(pos)
        if exhausted == "stop":
            if length > self.stop_length(n.tolist()):
                raise ConfigError(
                    f"mixture: an epoch of {length} items passes the end of a source "
                    f"(exhausted='stop' allows {self.stop_length(n.tolist())})"
                )
            return src, np.full(pos.shape, int(epoch), dtype=np.int64), k
        overall = int(epoch) * self.counts(length)[src] + k
        return src, overall // n[src], overall % n[src]


def rank_positions(
    length: int, start: int, world_size: int, slot: int, batch_size: int, drop_last: bool
) -> np.ndarray:
    """This rank's stream positions in ``[start, length)``, in order: global step
    ``k`` is ``[start + k*G, start + (k+1)*G)`` (``G = world_size × batch_size``) and
    rank ``slot`` takes its run ``[slot*B, (slot+1)*B)``. ``drop_last``: only whole
    global steps; otherwise the last, partial step is split the same way, so the last
    ranks get a short batch or none (nothing is repeated to even them out).
    Raises :class:`ConfigError` on bad arguments."""
    if batch_size < 1 or world_size < 1 or not 0 <= slot < world_size:
        raise ConfigError(
            f"mixture: bad split (slot {slot} of {world_size} ranks, batch size {batch_size})"
        )
    if start < 0:
        raise ConfigError(f"mixture: the resume position must be >= 0, got {start}")
    g = world_size * batch_size
    left = max(0, int(length) - int(start))
    steps = left // g if drop_last else -(-left // g)
    run = slot * batch_size + np.arange(batch_size, dtype=np.int64)
    pos = int(start) + (np.arange(steps, dtype=np.int64)[:, None] * g + run[None, :]).reshape(-1)
    return pos[pos < length]
