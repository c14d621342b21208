"""Shared helpers of the cache tests: synthetic blobs, their keys, counting fetchers."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import DiskTier, EntryKey
from fastload.shards.checksum import xxh3_128

DATASET = "file:///data/ds"


def blob(i: int, size: int) -> bytes:
    """Deterministic pseudo-random bytes for entry ``i``."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{i}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def key_for(data: bytes, shard: str = "shard-000000.tar", dataset: str = DATASET) -> EntryKey:
    """The cache key of ``data`` stored as ``shard`` of ``dataset``."""
    return EntryKey(dataset, shard, xxh3_128(data))


class CountingFetch:
    """A fetch callback that writes ``data`` and counts its calls (thread-safe)."""

    def __init__(self, data: bytes, fail: BaseException | None = None) -> None:
        self.data = data
        self.fail = fail
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, f: BinaryIO) -> None:
        with self._lock:
            self.calls += 1
        if self.fail is not None:
            raise self.fail
        f.write(self.data)


def data_files(root: Path) -> dict[str, int]:
    """Published files of a cache dir: ``{name: size}``."""
    data = root / "data"
    return {f"{p.parent.name}/{p.name}": p.stat().st_size for p in data.glob("*/*")}


def temp_files(root: Path) -> list[str]:
    """Temp files left in a cache dir."""
    return sorted(p.name for p in (root / "tmp").glob("*"))


@pytest.fixture(autouse=True)
def no_leaked_threads_or_processes() -> Iterator[None]:
    """Fail a test that leaves threads or child processes running."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        extra = [
            t
            for t in threading.enumerate()
            if t not in before
            and t.is_alive()
            # pytest-timeout's timers and tqdm's process-wide monitor are not ours
            and not isinstance(t, threading.Timer)
            and t.name != "tqdm_monitor"
        ]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"test left threads running: {extra}"
    assert multiprocessing.active_children() == []


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """An empty directory for a cache."""
    d = tmp_path / "cache"
    d.mkdir()
    return d


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line atomically (O_APPEND) — a counter shared by processes."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


#: Room a capped test tier keeps besides its measured metadata: the catalog growing by
#: a few pages and a new ``data/<dataset>/`` directory; less than one test entry.
SLACK = 48 * 1024


def capped_tier(root: Path, data_room: int, **kwargs: object) -> DiskTier:
    """A tier at ``root`` whose cap leaves ``data_room`` bytes (whole 4 KiB blocks) for
    entries besides its metadata (plus :data:`SLACK`)."""
    tier = DiskTier(root, **kwargs)  # type: ignore[arg-type]
    tier.set_limit(tier.metadata_bytes(least=True) + SLACK + data_room)
    return tier
