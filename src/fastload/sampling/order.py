"""The order of one epoch: shard permutation, canonical spans, shuffle windows.

The order is a pure function of (shard sample counts, seed, epoch, shuffle,
window size, canonical node count C); it never depends on the physical world, so
a job can resume onto a different number of nodes, ranks or workers.

1. The shards are permuted by (seed, epoch) and their samples laid end to end.
2. That sequence of N samples is cut into C *spans* of ``N // C`` or
   ``N // C + 1`` samples (span c is positions ``c*N//C .. (c+1)*N//C - 1``). A span
   covers a contiguous run of permuted shards, so span c touches only those shards
   and a shard is shared by at most two neighbouring spans: with S shards of m
   samples each (the last one may be smaller), a span touches at most
   ``ceil(S / C) + 3`` shards, and all spans together at most ``S + C - 1``.
3. Inside a span, the shard pieces are grouped into windows of ``window_shards``
   consecutive pieces and the samples of each window are shuffled. A reader
   walking a span therefore has about one window (a few shards) open at a time.

Randomness comes only from ``numpy.random.PCG64`` seeded through
``numpy.random.SeedSequence`` and read with ``random_raw``; permutations are made
by a stable ``argsort`` of those raw words (ties broken by position). NumPy
guarantees the SeedSequence and PCG64 bit streams across versions, unlike the
``Generator`` distribution methods (NEP 19), so the order is the same under every
NumPy release; ``tests/sampling/test_order.py`` pins literal orders to catch a
change. The map-style permutation (:func:`permute_positions`) is a keyed Feistel
network with cycle walking: plain integer arithmetic, so each rank computes only
its own positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastload.errors import ConfigError

__all__ = [
    "DEFAULT_WINDOW_SHARDS",
    "EpochLayout",
    "epoch_order",
    "permute_positions",
    "span_bounds",
]

#: Shards whose samples are shuffled together (see ``docs/benchmarks/shuffle.md``).
DEFAULT_WINDOW_SHARDS = 8

# Stream tags keep the random streams of different uses independent.
_TAG_SHARDS = 0x53484152
_TAG_WINDOW = 0x57494E44
_TAG_MAP = 0x4D415053
_KEY_BITS = 40  # random bits per sample key; the window id takes the other 24
_MAX_COMBINED_WINDOWS = 1 << (64 - _KEY_BITS)
_POSITION_LIMIT = 1 << (64 - _KEY_BITS)  # windows below this size sort (key, position)
_POSITION_MASK = np.uint64(_POSITION_LIMIT - 1)
_LOOP_WINDOWS = 512  # below this many windows a per-window loop is faster,
_LOOP_WINDOW_SIZE = 1024  # and above this mean window size
_FEISTEL_ROUNDS = 6


def _bit_generator(seed: int, *words: int) -> np.random.PCG64:
    return np.random.PCG64(np.random.SeedSequence([seed, *words]))


def _random_keys(bit_generator: np.random.PCG64, n: int) -> np.ndarray:
    raw = bit_generator.random_raw(n)
    return np.asarray(raw, dtype=np.uint64) >> np.uint64(64 - _KEY_BITS)


def check_seed(seed: int, epoch: int) -> None:
    """Raise :class:`ConfigError` unless ``seed`` and ``epoch`` are non-negative ints."""
    for name, value in (("seed", seed), ("epoch", epoch)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"sampling: {name} must be a non-negative integer, got {value!r}")


def shard_counts(shard_samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """``shard_samples`` as an int64 array; raises :class:`ConfigError` on negatives."""
    counts = np.asarray(shard_samples, dtype=np.int64).reshape(-1)
    if counts.size and counts.min() < 0:
        bad = int(np.argmin(counts))
        raise ConfigError(f"sampling: shard {bad} has a negative sample count {counts[bad]}")
    return counts


def span_bounds(num_samples: int, canonical_nodes: int) -> np.ndarray:
    """Start positions of the C spans plus the end: ``[c * N // C for c in 0..C]``."""
    if canonical_nodes < 1:
        raise ConfigError(f"sampling: canonical_nodes must be >= 1, got {canonical_nodes}")
    c = np.arange(canonical_nodes + 1, dtype=np.int64)
    return (c * num_samples) // canonical_nodes


def _sort_within_windows(keys: np.ndarray, window_starts: np.ndarray) -> np.ndarray:
    """Positions 0..L-1 reordered by a stable sort of ``keys`` inside each window.

    ``window_starts`` holds the first position of every window plus L. Both code
    paths give the same answer (a stable sort of the same keys per window)."""
    n = keys.size
    nwin = window_starts.size - 1
    # few or large windows: sorting each one alone is faster (and cache-friendly)
    if nwin <= _LOOP_WINDOWS or n >= _LOOP_WINDOW_SIZE * nwin or nwin >= _MAX_COMBINED_WINDOWS:
        out = np.empty(n, dtype=np.int64)
        position = np.arange(min(n, _POSITION_LIMIT), dtype=np.uint64)
        for a, b in zip(window_starts[:-1].tolist(), window_starts[1:].tolist(), strict=True):
            if b - a < _POSITION_LIMIT:
                # (key, position) words are unique, so a plain sort is the stable
                # argsort, and several times faster
                words = np.sort((keys[a:b] << np.uint64(64 - _KEY_BITS)) | position[: b - a])
                out[a:b] = (words & _POSITION_MASK).astype(np.int64) + a
            else:
                out[a:b] = np.argsort(keys[a:b], kind="stable") + a
        return out
    window_id = np.repeat(np.arange(nwin, dtype=np.uint64), np.diff(window_starts))
    combined = (window_id << np.uint64(_KEY_BITS)) | keys
    return np.argsort(combined, kind="stable").astype(np.int64, copy=False)


class EpochLayout:
    """The order of one epoch, computed span by span on demand.

    ``span(c)`` is the array of global sample indices of span c in epoch order
    (cached); ``order()`` is all spans end to end. Raises :class:`ConfigError` on a
    bad argument.
    """

    def __init__(
        self,
        shard_samples: Sequence[int] | np.ndarray,
        seed: int,
        epoch: int,
        *,
        shuffle: bool = True,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        canonical_nodes: int = 1,
    ) -> None:
        check_seed(seed, epoch)
        if window_shards < 1:
            raise ConfigError(f"sampling: window_shards must be >= 1, got {window_shards}")
        self.counts = shard_counts(shard_samples)
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.shuffle = bool(shuffle)
        self.window_shards = int(window_shards)
        self.canonical_nodes = int(canonical_nodes)
        self.num_samples = int(self.counts.sum())
        self.bounds = span_bounds(self.num_samples, self.canonical_nodes)
        #: first global index of every shard in manifest order
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64)
        num_shards = self.counts.size
        if self.shuffle and num_shards > 1:
            keys = _random_keys(_bit_generator(self.seed, _TAG_SHARDS, self.epoch), num_shards)
            self.shard_order = np.argsort(keys, kind="stable").astype(np.int64, copy=False)
        else:
            self.shard_order = np.arange(num_shards, dtype=np.int64)
        permuted = self.counts[self.shard_order]
        #: position in the permuted sequence where each permuted shard starts, plus N
        self.permuted_starts = np.concatenate(([0], np.cumsum(permuted))).astype(np.int64)
        self._spans: dict[int, np.ndarray] = {}
        self._order: np.ndarray | None = None

    def span_length(self, c: int) -> int:
        """Number of samples in span ``c``."""
        return int(self.bounds[c + 1] - self.bounds[c])

    def span_shards(self, c: int) -> np.ndarray:
        """Manifest numbers of the shards span ``c`` touches, in epoch order."""
        ts, _, lengths = self._pieces(c)
        return self.shard_order[ts[lengths > 0]]

    def _pieces(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = int(self.bounds[c]), int(self.bounds[c + 1])
        cum = self.permuted_starts
        if hi <= lo:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        t0 = int(np.searchsorted(cum, lo, side="right")) - 1
        t1 = int(np.searchsorted(cum, hi, side="left"))
        ts = np.arange(t0, t1, dtype=np.int64)
        piece_lo = np.maximum(cum[ts], lo)
        lengths = np.minimum(cum[ts + 1], hi) - piece_lo
        return ts, piece_lo, lengths

    def window_bounds(self, c: int) -> np.ndarray:
        """Positions in span ``c`` where its shuffle windows start, plus its length."""
        _, _, lengths = self._pieces(c)
        lengths = lengths[lengths > 0]
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        return np.append(starts[:: self.window_shards], int(lengths.sum()))

    def span(self, c: int) -> np.ndarray:
        """Global sample indices of span ``c`` in epoch order (int64, cached)."""
        if not 0 <= c < self.canonical_nodes:
            raise ConfigError(f"sampling: span {c} outside 0..{self.canonical_nodes - 1}")
        cached = self._spans.get(c)
        if cached is not None:
            return cached
        ts, piece_lo, lengths = self._pieces(c)
        keep = lengths > 0  # empty shards are not pieces
        ts, piece_lo, lengths = ts[keep], piece_lo[keep], lengths[keep]
        lo = int(self.bounds[c])
        n = int(lengths.sum())
        offset_in_span = piece_lo - lo
        first_global = self.starts[self.shard_order[ts]] + (piece_lo - self.permuted_starts[ts])
        samples = np.repeat(first_global - offset_in_span, lengths) + np.arange(n, dtype=np.int64)
        if self.shuffle and n > 1:
            window_starts = np.append(offset_in_span[:: self.window_shards], n)
            bitgen = _bit_generator(self.seed, _TAG_WINDOW, self.epoch, self.canonical_nodes, c)
            samples = samples[_sort_within_windows(_random_keys(bitgen, n), window_starts)]
        self._spans[c] = samples
        return samples

    def order(self) -> np.ndarray:
        """All spans end to end: a permutation of ``0..N-1`` (cached).

        Computed for all spans in one vectorised pass (the same values as
        :meth:`span` span by span); the spans are then views into it."""
        if self._order is not None:
            return self._order
        n = self.num_samples
        bounds, cum = self.bounds, self.permuted_starts
        # a piece starts at every shard start and every span start
        piece_lo = np.unique(np.concatenate((cum[:-1], bounds[:-1])))
        piece_lo = piece_lo[piece_lo < n]
        lengths = np.diff(np.append(piece_lo, n))
        ts = np.searchsorted(cum, piece_lo, side="right") - 1
        first_global = self.starts[self.shard_order[ts]] + (piece_lo - cum[ts])
        samples = np.repeat(first_global - piece_lo, lengths) + np.arange(n, dtype=np.int64)
        if self.shuffle and n > 1:
            spans = np.searchsorted(bounds, piece_lo, side="right") - 1
            first_piece = np.searchsorted(piece_lo, bounds[:-1], side="left")
            local_window = (np.arange(piece_lo.size) - first_piece[spans]) // self.window_shards
            new_window = np.ones(piece_lo.size, dtype=bool)
            new_window[1:] = (spans[1:] != spans[:-1]) | (local_window[1:] != local_window[:-1])
            window_starts = np.append(piece_lo[new_window], n)
            keys = np.concatenate(
                [
                    _random_keys(
                        _bit_generator(self.seed, _TAG_WINDOW, self.epoch, self.canonical_nodes, c),
                        self.span_length(c),
                    )
                    for c in range(self.canonical_nodes)
                    if self.span_length(c) > 0
                ]
            )
            samples = samples[_sort_within_windows(keys, window_starts)]
        self._order = samples
        for c in range(self.canonical_nodes):
            self._spans.setdefault(c, samples[bounds[c] : bounds[c + 1]])
        return samples


def epoch_order(
    shard_samples: Sequence[int] | np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window_shards: int = DEFAULT_WINDOW_SHARDS,
    canonical_nodes: int | None = None,
) -> np.ndarray:
    """The epoch's order: a permutation of the global sample indices ``0..N-1``.

    Shard s holds indices ``starts[s] .. starts[s] + shard_samples[s] - 1`` (manifest
    order). Shards are permuted by (seed, epoch), the sequence is cut into
    ``canonical_nodes`` (default 1) spans and samples are shuffled within windows of
    ``window_shards`` shards inside each span; with ``shuffle=False`` this is
    ``0..N-1``. Returns an int64 array. Raises :class:`ConfigError` on bad arguments.
    """
    layout = EpochLayout(
        shard_samples,
        seed,
        epoch,
        shuffle=shuffle,
        window_shards=window_shards,
        canonical_nodes=1 if canonical_nodes is None else canonical_nodes,
    )
    return layout.order()


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser; uint64 array arithmetic wraps modulo 2**64
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def permute_positions(
    positions: np.ndarray | Sequence[int], num_samples: int, seed: int, epoch: int
) -> np.ndarray:
    """Map positions of ``0..num_samples-1`` through a pseudo-random permutation keyed
    by (seed, epoch), computing only the positions asked for.

    A balanced Feistel network over the smallest even power of two covering
    ``num_samples``, with cycle walking for values outside the range; O(len(positions)).
    Returns int64 sample indices. Raises :class:`ConfigError` on a position outside
    the range.
    """
    check_seed(seed, epoch)
    pos = np.asarray(positions, dtype=np.int64).reshape(-1)
    if pos.size == 0:
        return pos.copy()
    if pos.min() < 0 or pos.max() >= num_samples:
        raise ConfigError(
            f"sampling: positions must lie in 0..{num_samples - 1}, got "
            f"{int(pos.min())}..{int(pos.max())}"
        )
    if num_samples <= 1:
        return pos.copy()
    bits = max(2, int(num_samples - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    keys = np.random.SeedSequence([seed, _TAG_MAP, epoch]).generate_state(
        _FEISTEL_ROUNDS, np.uint64
    )
    n = np.uint64(num_samples)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << half) | right

    x = feistel(pos.astype(np.uint64))
    outside = np.flatnonzero(x >= n)
    while outside.size:
        x[outside] = feistel(x[outside])
        outside = outside[x[outside] >= n]
    return x.astype(np.int64)
