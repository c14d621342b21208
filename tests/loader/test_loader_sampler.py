"""ResumableSampler over virtual worlds (property-based): equal counts per rank, each
sample once per epoch, exact resume also onto a different world."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.errors import ConfigError
from fastload.loader.sampler import (
    RankLayout,
    ResumableSampler,
    detect_rank_layout,
    sampler_order,
)
from fastload.sampling.world import World


def samplers(n: int, world_size: int, drop_last: bool, epoch: int = 0) -> list[ResumableSampler]:
    out = []
    for rank in range(world_size):
        s = ResumableSampler(
            n, shuffle=True, seed=11, layout=RankLayout(rank, world_size), drop_last=drop_last
        )
        s.set_epoch(epoch)
        out.append(s)
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 300),
    world_size=st.integers(1, 64),
    drop_last=st.booleans(),
    epoch=st.integers(0, 5),
)
def test_ranks_get_equal_counts_and_each_sample_once(
    n: int, world_size: int, drop_last: bool, epoch: int
) -> None:
    per_rank = [list(s) for s in samplers(n, world_size, drop_last, epoch)]
    assert len({len(p) for p in per_rank}) == 1
    counts = Counter(i for p in per_rank for i in p)
    if drop_last:
        assert all(c == 1 for c in counts.values())
        assert len(counts) == (n // world_size) * world_size
    elif n:
        assert set(counts) == set(range(n))
        assert max(counts.values()) - min(counts.values()) <= 1 + world_size // max(n, 1)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    global_batch=st.sampled_from([4, 8, 12, 24]),
    data=st.data(),
)
def test_resume_onto_another_world_gives_the_complement(
    n: int, global_batch: int, data: st.DataObject
) -> None:
    divisors = [w for w in range(1, global_batch + 1) if global_batch % w == 0]
    before = data.draw(st.sampled_from(divisors))
    after = data.draw(st.sampled_from(divisors))
    first = samplers(n, before, drop_last=True)
    second = samplers(n, after, drop_last=True)
    limit = min(first[0].total, second[0].total)
    consumed = data.draw(st.integers(0, limit // global_batch)) * global_batch
    done = [i for s in first for i in list(s)[: consumed // before]]
    rest: list[int] = []
    for s in second:
        s.set_start(consumed)
        rest += list(s)
    # both worlds walk the same world-independent global order
    order = sampler_order(np.arange(n), n, shuffle=True, seed=11, epoch=0).tolist()
    assert sorted(done) == sorted(order[:consumed])
    assert sorted(rest) == sorted(order[consumed : second[0].total])


def test_order_depends_on_seed_and_epoch_only() -> None:
    (a,) = samplers(50, 1, False, epoch=1)
    (b,) = samplers(50, 1, False, epoch=1)
    (c,) = samplers(50, 1, False, epoch=2)
    assert list(a) == list(b) != list(c)
    plain = ResumableSampler(5, shuffle=False, seed=0, layout=RankLayout(0, 1), drop_last=False)
    assert list(plain) == [0, 1, 2, 3, 4]


def test_bad_resume_points_and_worlds_are_config_errors() -> None:
    (s,) = samplers(10, 1, False)
    with pytest.raises(ConfigError, match="resume point 11"):
        s.set_start(11)
    two = samplers(10, 2, False)[0]
    with pytest.raises(ConfigError, match="multiple of the world size 2"):
        two.set_start(3)
    with pytest.raises(ConfigError, match="rank 2 is not in a world of 2"):
        RankLayout(2, 2)
    with pytest.raises(ConfigError, match="world_size"):
        detect_rank_layout(object())
    assert detect_rank_layout(World.of(3, 4)) == RankLayout(3, 4)


def test_the_old_name_epoch_order_still_imports_with_a_deprecation_warning() -> None:
    import fastload.loader
    import fastload.loader.sampler

    for module in (fastload.loader, fastload.loader.sampler):
        with pytest.warns(DeprecationWarning, match="renamed .*sampler_order"):
            old = module.epoch_order
        assert old is sampler_order
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from fastload.loader import sampler_order as new  # the new name does not warn
    assert new is sampler_order
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fastload.loader.nothing  # noqa: B018
