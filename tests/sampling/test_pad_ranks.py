"""``pad="ranks"``: the epoch ends in a short global step padded only so that every
rank gets the same number of samples: nothing is repeated on one rank, at most
world_size - 1 samples on W ranks, and resuming onto any world keeps that."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.sampling import (
    SamplerState,
    World,
    epoch_steps,
    map_rank_indices,
    plan_from_state,
    plan_rank,
    rank_samples,
)

FAST = settings(max_examples=60, deadline=None)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int]:
    """(shard counts, nodes, ranks per node, batch)."""
    nodes = draw(st.integers(1, 6))
    rpn = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 9))
    n = draw(st.integers(1, 400))
    m = draw(st.integers(1, 40))
    counts = np.full(-(-n // m), m, dtype=np.int64)
    counts[-1] = n - m * (counts.size - 1)
    return counts, nodes, rpn, batch


def _plans(counts: np.ndarray, nodes: int, rpn: int, batch: int, **kw: object) -> list[np.ndarray]:
    ws = nodes * rpn
    return [
        plan_rank(counts, 7, 3, World.of(slot, ws, rpn), batch, pad="ranks", **kw)  # type: ignore[arg-type]
        for slot in range(ws)
    ]


@FAST
@given(layout=layouts())
def test_every_sample_once_and_at_most_w_minus_1_repeats(
    layout: tuple[np.ndarray, int, int, int],
) -> None:
    counts, nodes, rpn, batch = layout
    n, ws = int(counts.sum()), nodes * rpn
    plans = _plans(counts, nodes, rpn, batch)
    sizes = {p.size for p in plans}
    assert len(sizes) == 1  # equal ranks
    (size,) = sizes
    assert size == rank_samples(n, ws, batch, canonical_nodes=nodes, pad="ranks")
    used = np.concatenate(plans)
    assert np.array_equal(np.unique(used), np.arange(n))  # every sample
    assert used.size - n < ws  # repeats only to even out the ranks
    assert size == -(-n // ws) or nodes > 1  # one layout node: exactly ceil(N / W)
    steps = epoch_steps(n, ws * batch, canonical_nodes=nodes, pad="ranks")
    assert -(-size // batch) == steps  # the short step is the rank's last batch


@FAST
@given(n=st.integers(1, 500), batch=st.integers(1, 64))
def test_one_rank_repeats_nothing(n: int, batch: int) -> None:
    plan = plan_rank([n], 0, 0, World.single(), batch, pad="ranks")
    assert np.array_equal(np.sort(plan), np.arange(n))
    mapped = map_rank_indices(n, 0, 0, World.single(), batch, pad="ranks")
    assert np.array_equal(np.sort(mapped), np.arange(n))
    # the example: 203 samples, batch 64, one rank -> 203, not 256
    assert plan_rank([203], 0, 0, World.single(), 64, pad="ranks").size == 203
    assert plan_rank([203], 0, 0, World.single(), 64).size == 256  # pad="batches"


@FAST
@given(layout=layouts(), data=st.data(), rpn2=st.integers(1, 4), nodes2=st.integers(1, 6))
def test_resume_onto_another_world_keeps_exactly_once(
    layout: tuple[np.ndarray, int, int, int], data: st.DataObject, rpn2: int, nodes2: int
) -> None:
    counts, nodes, rpn, batch = layout
    n, ws = int(counts.sum()), nodes * rpn
    g = ws * batch
    total = epoch_steps(n, g, canonical_nodes=nodes, pad="ranks")
    done = data.draw(st.integers(0, max(0, total - 1)))
    first = [p[: done * batch] for p in _plans(counts, nodes, rpn, batch)]
    # a new world with the same global batch (when it divides) resumes from the state
    ws2 = nodes2 * rpn2
    if g % ws2:
        return
    batch2 = g // ws2
    state = SamplerState(seed=7, epoch=3, samples_consumed=done * g, canonical_nodes=nodes)
    rest = [
        plan_from_state(state, counts, World.of(slot, ws2, rpn2), batch2, pad="ranks")
        for slot in range(ws2)
    ]
    assert len({r.size for r in rest}) == 1
    used = np.concatenate([*first, *rest])
    assert np.array_equal(np.unique(used), np.arange(n))
    assert used.size - n < max(ws, ws2)
