"""Property tests of the pure LRU eviction choice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastload.cache.policy import Candidate, choose_victims

candidates = st.lists(
    st.builds(
        Candidate,
        name=st.text("abcdef", min_size=1, max_size=4),
        size=st.integers(0, 1000),
        last_use=st.integers(0, 50).map(float),
        pinned=st.booleans(),
    ),
    max_size=30,
    unique_by=lambda c: c.name,
)


@given(candidates, st.integers(0, 3000), st.integers(0, 5000))
def test_victims_make_room_with_lru_minimal_unpinned_choice(
    entries: list[Candidate], need: int, limit: int
) -> None:
    victims, shortfall = choose_victims(entries, need, limit)
    by_name = {c.name: c for c in entries}
    assert len(set(victims)) == len(victims)
    assert all(not by_name[v].pinned for v in victims)
    used = sum(c.size for c in entries)
    freed = sum(by_name[v].size for v in victims)
    assert shortfall == max(used + need - freed - limit, 0)
    unpinned = [c for c in entries if not c.pinned]
    if shortfall > 0:
        # could not fit: every unpinned entry had to go
        assert set(victims) == {c.name for c in unpinned}
    if victims:
        # minimal: without the last victim it would not fit
        assert used + need - (freed - by_name[victims[-1]].size) > limit
        # LRU: every victim is no newer than every unpinned survivor
        newest = max((by_name[v].last_use, v) for v in victims)
        for c in unpinned:
            if c.name not in victims:
                assert (c.last_use, c.name) > newest
    else:
        assert used + need <= limit or not unpinned


@given(candidates, st.integers(0, 3000))
def test_no_limit_evicts_nothing(entries: list[Candidate], need: int) -> None:
    assert choose_victims(entries, need, None) == ([], 0)


def test_oldest_goes_first() -> None:
    entries = [Candidate("new", 10, 3.0), Candidate("old", 10, 1.0), Candidate("mid", 10, 2.0)]
    assert choose_victims(entries, 15, 30) == (["old", "mid"], 0)
    entries[1] = Candidate("old", 10, 1.0, pinned=True)
    assert choose_victims(entries, 15, 30) == (["mid", "new"], 0)
    assert choose_victims(entries, 25, 30) == (["mid", "new"], 5)
