"""Stateful property test of the disk tier's byte cap, pins, eviction and restarts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastload.cache import DiskTier, EntryKey, EntryState
from fastload.errors import CacheFullError

from .conftest import CountingFetch, blob, data_files, key_for

CAP = 1000
SIZES = [0, 1, 90, 150, 200, 333, 400, 512, 999, 1000, 1001]
BLOBS = [blob(900 + i, size) for i, size in enumerate(SIZES)]
KEYS = [key_for(b, f"shard-{i:06d}.tar") for i, b in enumerate(BLOBS)]


class DiskTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="fastload-stateful-"))
        self.tier = DiskTier(self.root, cache_limit=CAP)
        self.pins: list[int] = []  # indexes of entries pinned by this process (with repeats)
        self.fetches = 0

    def teardown(self) -> None:
        self.tier.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _size_of(self, key: EntryKey) -> int:
        return SIZES[KEYS.index(key)]

    @rule(i=st.integers(0, len(SIZES) - 1), pin=st.booleans())
    def get(self, i: int, pin: bool) -> None:
        fetch = CountingFetch(BLOBS[i])
        if SIZES[i] > CAP:
            with pytest.raises(CacheFullError):
                self.tier.get(KEYS[i], SIZES[i], fetch, pin=pin)
            assert fetch.calls == 0
            return
        path = self.tier.get(KEYS[i], SIZES[i], fetch, pin=pin)
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
        self.tier = DiskTier(self.root, cache_limit=CAP)

    @rule()
    def verify(self) -> None:
        assert self.tier.verify() == []

    @invariant()
    def cap_holds_and_catalog_matches_disk(self) -> None:
        files = data_files(self.root)
        entries = self.tier.entries()
        ready = {e.name: e.size for e in entries if e.state is EntryState.READY}
        assert files == ready
        pinned_names = {KEYS[i].name for i in self.pins}
        pinned_bytes = sum(SIZES[i] for i in set(self.pins))
        assert sum(files.values()) <= CAP + pinned_bytes
        # every pinned entry is still there, and pin counts match
        assert pinned_names <= set(files)
        counts = {e.name: e.pins for e in entries}
        for i in set(self.pins):
            assert counts[KEYS[i].name] == self.pins.count(i)
        assert self.tier.stats().bytes_used == sum(files.values())


DiskTierMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestDiskTierStateful = pytest.mark.slow(DiskTierMachine.TestCase)
