"""The epoch order: a permutation, deterministic, windowed, stable across NumPy versions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.errors import ConfigError
from fastload.sampling import EpochLayout, epoch_order, permute_positions, shard_of, span_bounds
from fastload.sampling.order import _sort_within_windows

COUNTS = [4, 3, 5, 2, 6]


def test_pinned_orders_catch_a_change_of_the_random_streams() -> None:
    # literal values: if a NumPy release changed SeedSequence/PCG64 (or this code
    # changed the order), every saved job state would resume onto another order
    assert epoch_order(COUNTS, seed=7, epoch=2, window_shards=2).tolist() == [
        4, 12, 6, 13, 5, 17, 15, 1, 14, 18, 0, 3, 19, 2, 16, 8, 7, 10, 9, 11,
    ]  # fmt: skip
    assert epoch_order(COUNTS, seed=7, epoch=2, window_shards=2, canonical_nodes=2).tolist() == [
        6, 12, 13, 5, 4, 14, 18, 16, 15, 17, 1, 2, 3, 19, 0, 7, 8, 11, 10, 9,
    ]  # fmt: skip
    assert permute_positions(range(10), 10, seed=7, epoch=2).tolist() == [
        0, 2, 5, 1, 3, 7, 4, 9, 6, 8,
    ]  # fmt: skip


counts_st = st.lists(st.integers(0, 30), min_size=1, max_size=40).filter(lambda c: sum(c) > 0)


@settings(max_examples=60, deadline=None)
@given(
    counts=counts_st,
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 1000),
    window=st.integers(1, 6),
    nodes=st.integers(1, 12),
)
def test_order_is_a_windowed_permutation(
    counts: list[int], seed: int, epoch: int, window: int, nodes: int
) -> None:
    layout = EpochLayout(counts, seed, epoch, window_shards=window, canonical_nodes=nodes)
    order = EpochLayout(counts, seed, epoch, window_shards=window, canonical_nodes=nodes).order()
    n = sum(counts)
    assert np.array_equal(np.sort(order), np.arange(n))
    bounds = span_bounds(n, nodes)
    for c in range(nodes):
        span = layout.span(c)  # computed span by span: must agree with the one pass
        assert np.array_equal(order[bounds[c] : bounds[c + 1]], span)
        # a span is a contiguous run of the permuted shards...
        touched = layout.span_shards(c)
        assert set(shard_of(span, counts).tolist()) == set(touched.tolist())
        # ...and every window draws from at most `window` shards
        wb = layout.window_bounds(c)
        assert wb[-1] == span.size
        for a, b in itertools.pairwise(wb):
            assert len(np.unique(shard_of(span[a:b], counts))) <= window
    # neighbouring spans share at most one shard
    for c in range(nodes - 1):
        shared = set(layout.span_shards(c).tolist()) & set(layout.span_shards(c + 1).tolist())
        assert len(shared) <= 1


def test_without_shuffle_the_order_is_manifest_order() -> None:
    for nodes in (1, 3, 7):
        order = epoch_order(COUNTS, seed=1, epoch=5, shuffle=False, canonical_nodes=nodes)
        assert order.tolist() == list(range(20))


def test_order_is_deterministic_and_changes_with_epoch_and_seed() -> None:
    counts = [50] * 8
    a = epoch_order(counts, seed=3, epoch=0)
    assert np.array_equal(a, epoch_order(counts, seed=3, epoch=0))
    assert not np.array_equal(a, epoch_order(counts, seed=3, epoch=1))
    assert not np.array_equal(a, epoch_order(counts, seed=4, epoch=0))


def test_window_of_one_shard_keeps_shards_whole() -> None:
    counts = [5] * 6
    order = epoch_order(counts, seed=2, epoch=0, window_shards=1)
    shards = shard_of(order, counts)
    # each shard's samples are adjacent: the shard sequence changes exactly 5 times
    assert np.count_nonzero(np.diff(shards)) == 5


@pytest.mark.parametrize(
    ("windows", "max_size"),
    [(700, 20), (100, 20), (600, 3000)],  # vectorised path; loop: few / large windows
)
def test_window_sort_paths_equal_a_stable_argsort(windows: int, max_size: int) -> None:
    rng = np.random.default_rng(windows)
    sizes = rng.integers(1, max_size, size=windows)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    keys = rng.integers(0, 8, size=int(starts[-1]), dtype=np.uint64)  # many ties
    got = _sort_within_windows(keys, starts)
    expected = np.concatenate(
        [np.argsort(keys[a:b], kind="stable") + a for a, b in itertools.pairwise(starts)]
    )
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4097])
def test_permute_positions_is_a_bijection(n: int) -> None:
    full = permute_positions(np.arange(n), n, seed=11, epoch=3)
    assert np.array_equal(np.sort(full), np.arange(n))
    some = np.arange(n)[::3]
    assert np.array_equal(permute_positions(some, n, seed=11, epoch=3), full[some])
    if n >= 16:
        assert not np.array_equal(full, permute_positions(np.arange(n), n, seed=11, epoch=4))
        assert not np.array_equal(full, np.arange(n))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: epoch_order([1, -1], 0, 0), "negative sample count"),
        (lambda: epoch_order([1], -1, 0), "seed"),
        (lambda: epoch_order([1], 0, -2), "epoch"),
        (lambda: epoch_order([1], 0, 0, window_shards=0), "window_shards"),
        (lambda: epoch_order([1], 0, 0, canonical_nodes=0), "canonical_nodes"),
        (lambda: permute_positions([5], 5, 0, 0), "positions"),
    ],
)
def test_bad_arguments(call: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()  # type: ignore[operator]
