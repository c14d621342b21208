"""The mixture schedule (``fastload.sampling.mixture``): every prefix within one item
of each source's share, exact counts per period, draws and positions that agree,
the epoch lengths of ``"stop"`` and ``"repeat"``, and a rank split that covers the
stream once."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.errors import ConfigError
from fastload.sampling.mixture import MAX_PERIOD, MixSchedule, rank_positions


def _prefix_counts(schedule: MixSchedule, total: int) -> np.ndarray:
    """(total + 1, sources): draws of each source in every prefix, walked position by
    position (not through ``counts``, which the test checks against it)."""
    src = schedule.sources(np.arange(total))
    out = np.zeros((total + 1, schedule.num_sources), dtype=np.int64)
    out[1:] = np.cumsum(np.eye(schedule.num_sources, dtype=np.int64)[src], axis=0)
    return out


def test_weights_half_three_tenths_fifth_over_100000_items() -> None:
    s = MixSchedule([0.5, 0.3, 0.2])
    assert s.period == 10
    assert s.quotas.tolist() == [5, 3, 2]
    counts = _prefix_counts(s, 100_000)
    assert counts[-1].tolist() == [50_000, 30_000, 20_000]
    t = np.arange(100_001)[:, None]
    assert np.abs(counts - t * np.array([0.5, 0.3, 0.2])).max() < 1
    # every period (10 items from a multiple of 10) holds exactly 5, 3 and 2
    per_period = counts[10::10] - counts[:-10:10]
    assert (per_period == [5, 3, 2]).all()
    assert (s.counts(12_345) == counts[12_345]).all()


@pytest.mark.parametrize("seed", range(40))
def test_every_prefix_is_within_one_item_of_its_share(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    weights = (rng.integers(1, 30, n) if seed % 2 else rng.random(n) + 1e-3).tolist()
    s = MixSchedule(weights)
    k = s.period
    assert int(s.quotas.sum()) == k
    assert (s.quotas > 0).all()
    assert np.abs(s.quotas - k * s.weights).max() < 1  # apportioned within one
    counts = _prefix_counts(s, 3 * k)
    t = np.arange(3 * k + 1)[:, None]
    assert np.abs(counts * k - t * s.quotas[None, :]).max() < k  # |c - T q / K| < 1
    if seed % 2:  # integer weights are exact: within one of T * w itself
        assert k < MAX_PERIOD
        assert np.abs(counts - t * s.weights[None, :]).max() < 1


def test_draws_and_positions_agree() -> None:
    s = MixSchedule([3, 1, 1, 2])
    pos = np.arange(5_000)
    src, k = s.sources(pos), s.draws(pos)
    for t in range(0, 5_000, 7):
        assert s.position_of(int(src[t]), int(k[t])) == t
    for i in range(4):  # a source's draws are 0, 1, 2, ... in stream order
        assert k[src == i].tolist() == list(range(int((src == i).sum())))


def test_stop_and_cover_lengths() -> None:
    s = MixSchedule([0.5, 0.3, 0.2])
    assert s.stop_length([50_000, 30_000, 20_000]) == 100_000
    stop = s.stop_length([100, 100, 100])  # the first source runs out first
    counts = s.counts(stop)
    assert counts[0] == 100
    assert (counts <= 100).all()
    assert s.sources(np.array([stop]))[0] == 0  # the next position would be its 101st
    cover = s.cover_length([100, 100, 100])  # the last source is drawn whole there
    assert (s.counts(cover) >= 100).all()
    assert s.counts(cover - 1)[2] == 99


def test_repeat_walks_each_source_epoch_by_epoch() -> None:
    s = MixSchedule([0.5, 0.3, 0.2])
    sizes = [70, 40, 9]
    length = 1_000
    seen: list[list[tuple[int, int]]] = [[], [], []]
    for epoch in range(3):
        src, source_epoch, index = s.locate(np.arange(length), epoch, length, sizes, "repeat")
        for i, e, j in zip(src.tolist(), source_epoch.tolist(), index.tolist(), strict=True):
            seen[i].append((e, j))
    for i, n in enumerate(sizes):
        # the k-th draw overall is item k mod n of source epoch k // n: each source
        # epoch is used whole, in order, across the mixture's epochs
        assert seen[i] == [(k // n, k % n) for k in range(len(seen[i]))]


def test_stop_refuses_an_epoch_past_a_source() -> None:
    s = MixSchedule([0.5, 0.5])
    with pytest.raises(ConfigError, match="passes the end"):
        s.locate(np.arange(3), 0, 50, [10, 10], "stop")
    with pytest.raises(ConfigError, match="exhausted"):
        s.locate(np.arange(3), 0, 3, [10, 10], "cycle")


@pytest.mark.parametrize("weights", [[], [1, 0], [1, -1], [1, float("nan")], ["a"], [True]])
def test_bad_weights_are_refused(weights: list[object]) -> None:
    with pytest.raises(ConfigError, match="weight"):
        MixSchedule(weights)  # type: ignore[arg-type]


def test_a_weight_too_small_for_the_period_is_refused() -> None:
    with pytest.raises(ConfigError, match="too small"):
        MixSchedule([1.0, 5e-5])
    for period in (0, 10**6 + 1):
        with pytest.raises(ConfigError, match="period"):
            MixSchedule([1, 1], period=period)
    assert MixSchedule([1.0, 5e-5], period=40_000).quotas.tolist() == [39_998, 2]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("world_size", "batch"), [(1, 7), (2, 6), (3, 4), (5, 3)])
def test_rank_positions_cover_the_stream_once(world_size: int, batch: int, drop_last: bool) -> None:
    length, start = 1_003, 36
    parts = [
        rank_positions(length, start, world_size, r, batch, drop_last) for r in range(world_size)
    ]
    every = np.concatenate(parts)
    assert np.unique(every).size == every.size  # no position twice
    g = world_size * batch
    if drop_last:
        assert sorted(every.tolist()) == list(range(start, start + (length - start) // g * g))
        assert len({p.size for p in parts}) == 1  # equal batches per rank
    else:
        assert sorted(every.tolist()) == list(range(start, length))
        assert max(p.size for p in parts) - min(p.size for p in parts) <= batch
    # rank r's batches interleaved step by step give the stream in order
    steps = [p.reshape(-1) for p in parts]
    merged = []
    for k in range(-(-max(p.size for p in steps) // batch)):
        for p in steps:
            merged += p[k * batch : (k + 1) * batch].tolist()
    assert merged == sorted(every.tolist())
