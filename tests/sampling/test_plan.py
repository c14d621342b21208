"""Partition over virtual worlds and resume arithmetic, property-based.

Worlds go up to 1,000 nodes × 8 ranks × 8 workers; the whole job's global batches are
computed once (vectorised) and every rank's plan is checked against its columns.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.errors import ConfigError
from fastload.sampling import (
    SamplerState,
    World,
    epoch_order,
    epoch_steps,
    global_batches,
    map_rank_indices,
    plan_from_state,
    plan_rank,
    shard_of,
    shards_in_order,
    shards_touched,
    span_bounds,
    worker_indices,
)


@dataclass(frozen=True)
class Case:
    nodes: int
    ranks_per_node: int
    batch: int
    counts: np.ndarray  # samples per shard, manifest order
    seed: int
    epoch: int
    window: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def world(self, slot: int) -> World:
        return World.of(slot, self.world_size, self.ranks_per_node)

    def batches(self, drop_last: bool, samples_consumed: int = 0) -> np.ndarray:
        return global_batches(
            self.counts,
            self.seed,
            self.epoch,
            self.global_batch,
            drop_last=drop_last,
            samples_consumed=samples_consumed,
            canonical_nodes=self.nodes,
            window_shards=self.window,
        )

    def rank(self, slot: int, drop_last: bool, samples_consumed: int = 0) -> np.ndarray:
        return plan_rank(
            self.counts,
            self.seed,
            self.epoch,
            self.world(slot),
            self.batch,
            drop_last=drop_last,
            samples_consumed=samples_consumed,
            window_shards=self.window,
        )


@st.composite
def cases(
    draw: st.DrawFn, max_nodes: int = 1000, equal_shards: bool = False, max_ranks: int = 8
) -> Case:
    nodes = draw(st.integers(1, max_nodes))
    rpn = draw(st.integers(1, max_ranks))
    batch = draw(st.integers(1, 4))
    ws = nodes * rpn
    n = draw(st.integers(ws, 3 * ws * batch + 40))  # dataset ≥ ranks
    m = draw(st.integers(1, 40))  # samples per shard
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    num_shards = -(-n // m)
    if equal_shards or draw(st.booleans()):
        counts = np.full(num_shards, m, dtype=np.int64)
        counts[-1] = n - m * (num_shards - 1)
    else:  # ragged sizes, empty shards included
        counts = rng.integers(0, 2 * m + 1, size=num_shards)
        if counts.sum() == 0:
            counts[0] = 1
    return Case(
        nodes,
        rpn,
        batch,
        counts,
        seed=draw(st.integers(0, 2**63)),
        epoch=draw(st.integers(0, 100)),
        window=draw(st.integers(1, 5)),
    )


def loader_order(rank_plan: np.ndarray, batch: int, num_workers: int) -> np.ndarray:
    """What torch's DataLoader yields: worker batches round-robin, exhausted workers skipped."""
    queues = []
    for w in range(num_workers):
        part = worker_indices(rank_plan, batch, num_workers, w)
        queues.append([part[i : i + batch] for i in range(0, part.size, batch)])
    out: list[np.ndarray] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def node_shard_counts(case: Case, gb: np.ndarray) -> np.ndarray:
    """Number of distinct shards each node reads (node-major columns of the batches)."""
    per_node = case.ranks_per_node * case.batch
    nodes = np.broadcast_to(np.arange(gb.shape[1]) // per_node, gb.shape)
    pairs = np.unique(nodes.reshape(-1) * case.counts.size + shard_of(gb.reshape(-1), case.counts))
    return np.bincount(pairs // case.counts.size, minlength=case.nodes)


def check_cover(case: Case, used: np.ndarray, drop_last: bool) -> None:
    n, g = case.n, case.global_batch
    if drop_last:
        assert used.size == n - n % g
        assert np.unique(used).size == used.size  # at most once
    else:
        assert used.size == math.ceil(n / g) * g
        assert np.array_equal(np.unique(used), np.arange(n))  # at least once
        assert used.size - n < g  # the pad is less than one global batch


FAST = settings(max_examples=40, deadline=None)


@FAST
@given(case=cases(), drop_last=st.booleans(), data=st.data())
def test_every_sample_once_and_equal_shares(
    case: Case, drop_last: bool, data: st.DataObject
) -> None:
    gb = case.batches(drop_last)
    steps = epoch_steps(case.n, case.global_batch, canonical_nodes=case.nodes, drop_last=drop_last)
    assert gb.shape == (steps, case.global_batch)
    check_cover(case, gb.reshape(-1), drop_last)
    # each rank's plan is its run of every global batch: K batches of B
    slots = {0, case.world_size - 1, data.draw(st.integers(0, case.world_size - 1))}
    for slot in slots:
        cols = gb[:, slot * case.batch : (slot + 1) * case.batch]
        assert np.array_equal(case.rank(slot, drop_last), cols.reshape(-1))


@FAST
@given(case=cases(max_nodes=8), drop_last=st.booleans())
def test_all_ranks_of_small_worlds_partition_the_epoch(case: Case, drop_last: bool) -> None:
    plans = [case.rank(slot, drop_last) for slot in range(case.world_size)]
    assert len({p.size for p in plans}) == 1
    check_cover(case, np.concatenate(plans), drop_last)
    if not drop_last:
        # padding repeats each span's own samples from its start
        order = epoch_order(
            case.counts,
            case.seed,
            case.epoch,
            window_shards=case.window,
            canonical_nodes=case.nodes,
        )
        bounds = span_bounds(case.n, case.nodes)
        per_node = case.ranks_per_node * case.batch
        gb = case.batches(drop_last)
        for c in range(case.nodes):
            seq = gb[:, c * per_node : (c + 1) * per_node].reshape(-1)
            # (an empty span, when there are more nodes than samples, pads from the order)
            span = order[bounds[c] : bounds[c + 1]] if bounds[c + 1] > bounds[c] else order
            assert np.array_equal(seq, np.resize(span, seq.size))


@FAST
@given(case=cases(equal_shards=True), drop_last=st.booleans())
def test_each_node_touches_about_one_nth_of_the_shards(case: Case, drop_last: bool) -> None:
    # bound: with equal shards (the last may be shorter) a node touches at most
    # ceil(S / N) + 3 shards, and all nodes together at most S + N - 1
    per_node = node_shard_counts(case, case.batches(drop_last))
    num_shards = case.counts.size
    assert per_node.max() <= math.ceil(num_shards / case.nodes) + 3
    assert per_node.sum() <= num_shards + case.nodes - 1
    # spot-check the vectorised count against shards_touched for one node
    gb, b = case.batches(drop_last), case.ranks_per_node * case.batch
    assert shards_touched(gb[:, :b], case.counts).size == per_node[0]


@FAST
@given(case=cases(max_nodes=50), drop_last=st.booleans())
def test_nodes_share_few_shards_for_any_shard_sizes(case: Case, drop_last: bool) -> None:
    batches = case.batches(drop_last)
    total = node_shard_counts(case, batches).sum()
    # padding (drop_last=False) wraps the stream around onto the first shard, once per
    # time it passes the end: more than once when there are fewer samples than one
    # global batch (2 samples over 5 nodes x batch 2 wrap 4 times)
    wraps = 0 if drop_last or case.n == 0 else -(-batches.size // case.n) - 1
    assert total <= np.count_nonzero(case.counts) + case.nodes - 1 + wraps


@FAST
@given(case=cases(max_nodes=64), drop_last=st.booleans())
def test_order_is_deterministic_and_epochs_differ(case: Case, drop_last: bool) -> None:
    a = case.rank(0, drop_last)
    assert np.array_equal(a, case.rank(0, drop_last))
    other = Case(**{**case.__dict__, "epoch": case.epoch + 1})
    whole, whole_next = case.batches(drop_last), other.batches(drop_last)
    assert whole.shape == whole_next.shape
    if case.n >= 30 * case.nodes:  # spans of >= 30 samples: a collision is no chance event
        assert not np.array_equal(whole, whole_next)


@FAST
@given(case=cases(), drop_last=st.booleans(), workers=st.integers(1, 8), data=st.data())
def test_workers_in_loader_order_give_the_rank_sequence(
    case: Case, drop_last: bool, workers: int, data: st.DataObject
) -> None:
    slot = data.draw(st.integers(0, case.world_size - 1))
    plan = case.rank(slot, drop_last)
    parts = [worker_indices(plan, case.batch, workers, w) for w in range(workers)]
    assert sum(p.size for p in parts) == plan.size
    assert np.array_equal(loader_order(plan, case.batch, workers), plan)
    # also with a short last batch
    ragged = np.arange(data.draw(st.integers(0, 50)))
    assert np.array_equal(loader_order(ragged, case.batch, workers), ragged)


@FAST
@given(case=cases(), drop_last=st.booleans(), data=st.data())
def test_resume_on_the_same_world_is_the_exact_suffix(
    case: Case, drop_last: bool, data: st.DataObject
) -> None:
    gb = case.batches(drop_last)
    k = data.draw(st.integers(0, gb.shape[0]))
    consumed = k * case.global_batch
    assert np.array_equal(case.batches(drop_last, consumed), gb[k:])
    slot = data.draw(st.integers(0, case.world_size - 1))
    full = case.rank(slot, drop_last).reshape(-1, case.batch)
    assert np.array_equal(case.rank(slot, drop_last, consumed), full[k:].reshape(-1))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def run_elastic(
    case: Case, k: int, nodes2: int, rpn2: int, batch2: int, drop_last: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Consume k steps on case's world, resume the epoch on nodes2 × rpn2 × batch2.

    Returns (what the job consumed over the epoch, what an uninterrupted run consumes).
    """
    full = case.batches(drop_last)
    first = full[:k].reshape(-1)
    consumed = k * case.global_batch
    ws2 = nodes2 * rpn2
    second = [
        plan_rank(
            case.counts,
            case.seed,
            case.epoch,
            World.of(slot, ws2, rpn2),
            batch2,
            drop_last=drop_last,
            samples_consumed=consumed,
            canonical_nodes=case.nodes,
            window_shards=case.window,
        )
        for slot in range(ws2)
    ]
    assert len({p.size for p in second}) == 1  # equal shares after the resume too
    return np.concatenate([first, *second]), full.reshape(-1)


@settings(max_examples=60, deadline=None)
@given(case=cases(max_nodes=16), drop_last=st.booleans(), data=st.data())
def test_elastic_resume_with_the_same_global_batch(
    case: Case, drop_last: bool, data: st.DataObject
) -> None:
    g = case.global_batch
    ws2 = data.draw(st.sampled_from(divisors(g)))
    rpn2 = data.draw(st.sampled_from(divisors(ws2)))
    steps = epoch_steps(case.n, g, canonical_nodes=case.nodes, drop_last=drop_last)
    k = data.draw(st.integers(0, steps))
    used, uninterrupted = run_elastic(case, k, ws2 // rpn2, rpn2, g // ws2, drop_last)
    # the same samples as the uninterrupted epoch: nothing lost, nothing repeated
    assert np.array_equal(np.sort(used), np.sort(uninterrupted))
    check_cover(case, used, drop_last)


@settings(max_examples=40, deadline=None)
@given(case=cases(max_nodes=16), drop_last=st.booleans(), data=st.data())
def test_elastic_resume_with_another_global_batch(
    case: Case, drop_last: bool, data: st.DataObject
) -> None:
    # any new global batch that is a multiple of the canonical node count works
    g2 = case.nodes * data.draw(st.integers(1, 12))
    ws2 = data.draw(st.sampled_from(divisors(g2)))
    rpn2 = data.draw(st.sampled_from(divisors(ws2)))
    steps = epoch_steps(case.n, case.global_batch, canonical_nodes=case.nodes, drop_last=drop_last)
    k = data.draw(st.integers(0, steps))
    used, _ = run_elastic(case, k, ws2 // rpn2, rpn2, g2 // ws2, drop_last)
    if drop_last:
        assert np.unique(used).size == used.size
    else:
        assert np.array_equal(np.unique(used), np.arange(case.n))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ((1, 4, 6), (1, 3, 8)),  # 4 ranks × 6 → 3 ranks × 8
        ((2, 4, 4), (1, 2, 16)),  # 8 × 4 → 2 × 16
        ((1, 4, 4), (2, 2, 4)),  # one node → two nodes
        ((2, 2, 4), (1, 4, 4)),  # two nodes → one node
        ((4, 8, 2), (8, 4, 2)),
    ],
)
@pytest.mark.parametrize("drop_last", [True, False])
def test_named_elastic_resumes(
    first: tuple[int, int, int], second: tuple[int, int, int], drop_last: bool
) -> None:
    counts = np.array([37] * 20 + [11])
    case = Case(*first, counts=counts, seed=5, epoch=3, window=3)
    steps = epoch_steps(case.n, case.global_batch, canonical_nodes=case.nodes, drop_last=drop_last)
    for k in (0, 1, steps // 2, steps - 1, steps):
        used, uninterrupted = run_elastic(case, k, *second, drop_last)
        assert np.array_equal(np.sort(used), np.sort(uninterrupted))


def test_one_node_to_two_nodes_then_a_new_layout_next_epoch() -> None:
    counts = [16] * 32
    one = World.of(0, 4, 4)
    state = SamplerState(seed=1).started(one, batch_size=4, num_samples=512)
    assert state.canonical_nodes == 1
    state = state.advanced(10, 16)
    two = World.of(2, 4, 2)  # node 1 of 2 after the resume
    rest = plan_from_state(state, counts, two, 4)
    assert rest.size == (512 - 160) // 16 * 4
    nxt = state.next_epoch().started(two, batch_size=4, num_samples=512)
    assert (nxt.epoch, nxt.samples_consumed, nxt.canonical_nodes) == (1, 0, 2)
    node_shards = shards_touched(
        np.concatenate([plan_from_state(nxt, counts, World.of(s, 4, 2), 4) for s in (2, 3)]),
        counts,
    )
    assert node_shards.size <= 32 // 2 + 1


# ---------------------------------------------------------------- state and errors


def test_state_round_trips_through_json() -> None:
    state = SamplerState(
        seed=3,
        epoch=2,
        samples_consumed=96,
        canonical_nodes=2,
        global_batch_size=32,
        num_samples=1000,
    )
    text = json.dumps(state.to_dict())
    assert json.loads(text)["version"] == 1
    assert SamplerState.from_dict(json.loads(text)) == state
    # numpy integers (e.g. from a step counter array) are stored as plain ints
    from_numpy = SamplerState(seed=np.int64(3), samples_consumed=np.uint32(8))  # type: ignore[arg-type]
    assert json.loads(json.dumps(from_numpy.to_dict()))["samples_consumed"] == 8


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"kind": "other", "version": 1}, "kind"),
        ({"kind": "fastload.sampler", "version": 2}, "version 2"),
        ({"kind": "fastload.sampler", "version": 1, "steps": 3}, "unknown fields"),
        ({"kind": "fastload.sampler", "version": 1, "samples_consumed": -1}, "samples_consumed"),
        ({"kind": "fastload.sampler", "version": 1, "canonical_nodes": 0}, "canonical_nodes"),
        ({"kind": "fastload.sampler", "version": 1, "seed": -3}, "seed"),
        ({"kind": "fastload.sampler", "version": 1, "epoch": "2"}, "epoch must be an int"),
        ({"kind": "fastload.sampler", "version": 1, "num_samples": 1.5}, "num_samples"),
    ],
)
def test_bad_states(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SamplerState.from_dict(data)


def test_impossible_resumes_are_config_errors() -> None:
    counts = [10] * 10
    state = SamplerState(
        seed=0, samples_consumed=24, canonical_nodes=4, global_batch_size=24, num_samples=100
    )
    with pytest.raises(ConfigError, match="not a multiple of the 4 canonical nodes"):
        plan_from_state(state, counts, World.of(0, 3), 2)  # G = 6
    with pytest.raises(ConfigError, match="now has 90"):
        plan_from_state(state, [10] * 9, World.of(0, 4), 6)
    with pytest.raises(ConfigError, match="no canonical_nodes"):
        plan_from_state(SamplerState(samples_consumed=8), counts, World.of(0, 4), 2)
    with pytest.raises(ConfigError, match="multiple of"):
        plan_rank(counts, 0, 0, World.of(0, 4), 2, samples_consumed=6, canonical_nodes=4)
    with pytest.raises(ConfigError, match="no samples"):
        plan_rank([0, 0], 0, 0, World.single(), 2)
    with pytest.raises(ConfigError, match="batch_size"):
        plan_rank(counts, 0, 0, World.single(), 0)
    with pytest.raises(ConfigError, match="worker"):
        worker_indices(np.arange(4), 2, 2, 2)
    # a state with nothing consumed takes the layout of the world it meets
    fresh = SamplerState(seed=0)
    assert plan_from_state(fresh, counts, World.of(0, 3), 2).size == math.ceil(100 / 6) * 2


def test_more_nodes_than_samples() -> None:
    counts = [3]
    world_size = 8
    plans = [plan_rank(counts, 0, 0, World.of(s, world_size, 1), 1) for s in range(world_size)]
    assert {p.size for p in plans} == {1}
    assert set(np.concatenate(plans).tolist()) == {0, 1, 2}
    dropped = [
        plan_rank(counts, 0, 0, World.of(s, world_size, 1), 1, drop_last=True)
        for s in range(world_size)
    ]
    assert all(p.size == 0 for p in dropped)


def test_shard_helpers() -> None:
    counts = [2, 0, 3]
    assert shard_of(np.array([0, 1, 2, 4]), counts).tolist() == [0, 0, 2, 2]
    assert shards_touched(np.array([4, 0, 3]), counts).tolist() == [0, 2]
    assert shards_in_order(np.array([4, 0, 3, 1]), counts).tolist() == [2, 0]
    with pytest.raises(ConfigError, match="outside"):
        shard_of(np.array([5]), counts)


# ---------------------------------------------------------------- map-style


@FAST
@given(
    nodes=st.integers(1, 1000),
    rpn=st.integers(1, 8),
    batch=st.integers(1, 4),
    extra=st.integers(0, 500),
    seed=st.integers(0, 2**32),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_map_style_partition_and_resume(
    nodes: int,
    rpn: int,
    batch: int,
    extra: int,
    seed: int,
    drop_last: bool,
    data: st.DataObject,
) -> None:
    ws = nodes * rpn
    n = ws + extra
    g = ws * batch
    slots = sorted({0, ws - 1, data.draw(st.integers(0, ws - 1))})
    plans = {
        s: map_rank_indices(n, seed, 1, World.of(s, ws, rpn), batch, drop_last=drop_last)
        for s in slots
    }
    steps = n // g if drop_last else -(-n // g)
    assert {p.size for p in plans.values()} == {steps * batch}
    if ws <= 64:  # check the whole job on small worlds
        allp = np.concatenate(
            [
                map_rank_indices(n, seed, 1, World.of(s, ws, rpn), batch, drop_last=drop_last)
                for s in range(ws)
            ]
        )
        check_cover(Case(nodes, rpn, batch, np.array([n]), seed, 1, 1), allp, drop_last)
    k = data.draw(st.integers(0, steps))
    for s, full in plans.items():
        rest = map_rank_indices(
            n,
            seed,
            1,
            World.of(s, ws, rpn),
            batch,
            drop_last=drop_last,
            samples_consumed=k * g,
        )
        assert np.array_equal(rest, full.reshape(-1, batch)[k:].reshape(-1))


def test_map_style_without_shuffle_is_strided_by_global_batch() -> None:
    plan = map_rank_indices(10, 0, 0, World.of(1, 2), 2, shuffle=False)
    assert plan.tolist() == [2, 3, 6, 7, 0, 1]  # the pad repeats the start of the order
