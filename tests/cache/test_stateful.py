"""Stateful property test of the disk tier's byte cap, pins, eviction and restarts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastload.cache import DiskTier, EntryState
from fastload.cache.catalog import blocks
from fastload.errors import CacheFullError

from .conftest import SLACK, CountingFetch, blob, capped_tier, data_files, key_for

ROOM = 40 * 1024  # bytes of entries the cap leaves besides metadata (and SLACK)
SIZES = [0, 1, 5000, 9000, 12_288, 20_000, 40_000, 40 * 1024 + SLACK + 1]
BLOBS = [blob(900 + i, size) for i, size in enumerate(SIZES)]
KEYS = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(BLOBS)]


class DiskTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="fastload-stateful-"))
        self.tier = capped_tier(self.root, ROOM, room_wait_s=0.0)
        self.cap = self.tier.limit
        self.pins: list[int] = []  # indexes of entries pinned by this process (with repeats)
        self.fetches = 0

    def teardown(self) -> None:
        self.tier.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(i=st.integers(0, len(SIZES) - 1), pin=st.booleans())
    def get(self, i: int, pin: bool) -> None:
        fetch = CountingFetch(BLOBS[i])
        try:
            path = self.tier.get(KEYS[i], SIZES[i], fetch, pin=pin)
        except CacheFullError:
            # refused only when it cannot fit beside what is pinned, and before fetching
            pinned = sum(blocks(SIZES[j]) for j in set(self.pins) if j != i)
            assert blocks(SIZES[i]) + pinned > ROOM
            assert fetch.calls == 0
            return
        assert blocks(SIZES[i]) <= ROOM + SLACK
        assert path.read_bytes() == BLOBS[i]
        self.fetches += fetch.calls
        if pin:
            self.pins.append(i)

    @precondition(lambda self: bool(self.pins))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.pins))
        self.pins.remove(i)
        self.tier.unpin(KEYS[i])

    @rule()
    def restart(self) -> None:
        self.tier.close()
        self.pins = []  # close released them
        self.tier = DiskTier(self.root, room_wait_s=0.0)  # the cap is stored
        assert self.tier.limit == self.cap

    @rule()
    def verify(self) -> None:
        assert self.tier.verify() == []

    @invariant()
    def cap_holds_and_catalog_matches_disk(self) -> None:
        files = data_files(self.root)
        entries = self.tier.entries()
        ready = {e.name: e.size for e in entries if e.state is EntryState.READY}
        assert files == ready
        usage = self.tier.usage()
        assert usage["total"] is not None
        assert self.cap is not None
        assert usage["total"] <= self.cap  # a hard cap: pins never push it over
        assert sum(blocks(v) for v in files.values()) == usage["data"]
        # every pinned entry is still there, and shows as pinned
        pinned_names = {KEYS[i].name for i in self.pins}
        assert pinned_names <= set(files)
        flags = {e.name: e.pins for e in entries}
        for name in pinned_names:
            assert flags[name] == 1
        assert self.tier.stats().bytes_used == sum(files.values())


DiskTierMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestDiskTierStateful = pytest.mark.slow(DiskTierMachine.TestCase)
