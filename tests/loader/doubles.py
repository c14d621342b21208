"""Test doubles for the loader tests: a map-style and a resumable iterable dataset.

Both count their work per process through ``io_stats()`` (the IOStatsSource
protocol), so tests can assert on what was loaded, where.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.errors import ConfigError

ITEM_BYTES = 8


class SquaresDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Item ``i`` is ``{"idx": i, "img": a 3x4x4 tensor full of i, "name": "s<i>"}``.

    Records the indices it loaded in this process (``loaded``) and counts them as
    ``disk_bytes``/``cache_hits``; ``sleep_s`` makes each item slow.
    """

    def __init__(self, n: int, sleep_s: float = 0.0, with_stats: bool = True) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.loaded: list[int] = []
        self.with_stats = with_stats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.loaded.append(i)
        return {"idx": i, "img": torch.full((3, 4, 4), float(i)), "name": f"s{i}"}

    def io_stats(self) -> dict[str, int]:
        items = len(self.loaded)
        return {
            "disk_bytes": items * ITEM_BYTES,
            "cache_hits": items,
            "cache_misses": items // 2,
        }


class PlainDataset(torch.utils.data.Dataset[int]):
    """Map-style dataset without io_stats: item ``i`` is ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class RangeStream(torch.utils.data.IterableDataset[dict[str, Any]]):
    """A resumable iterable over ``range(n)`` implementing ResumableIterable.

    The epoch's global order is a permutation by (seed, epoch); rank ``r`` of ``W``
    gets global positions ``r, r+W, ...`` (dropped or padded to equal counts); after
    ``samples_consumed`` global positions it yields the rest, split over DataLoader
    workers by whole batches, round-robin.
    """

    def __init__(
        self, n: int, *, seed: int = 0, rank: int = 0, world_size: int = 1, sleep_s: float = 0.0
    ) -> None:
        self.n = n
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.sleep_s = sleep_s
        self.epoch = 0
        self.batch_size = 1
        self.drop_last = False
        self.samples_consumed = 0
        self.yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.samples_consumed = samples_consumed

    def loader_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "n": self.n}

    def load_loader_state(self, state: dict[str, Any]) -> None:
        if state != self.loader_state():
            raise ConfigError(f"RangeStream state {state} does not fit {self.loader_state()}")

    def _per_rank(self) -> int:
        if self.drop_last:
            return self.n // self.world_size
        return -(-self.n // self.world_size)

    def __len__(self) -> int:
        return self._per_rank()

    def rank_sequence(self) -> np.ndarray:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        total = self._per_rank() * self.world_size
        order = np.resize(order, total)
        return order[self.samples_consumed + self.rank :: self.world_size]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        seq = self.rank_sequence()
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        b = self.batch_size
        num_batches = len(seq) // b if self.drop_last else -(-len(seq) // b)
        for j in range(worker, num_batches, workers):
            for i in seq[j * b : (j + 1) * b]:
                if self.sleep_s:
                    time.sleep(self.sleep_s)
                self.yielded += 1
                yield {"idx": int(i), "img": torch.full((2, 2), float(i))}

    def io_stats(self) -> dict[str, int]:
        return {"ram_bytes": self.yielded * ITEM_BYTES, "cache_hits": self.yielded}


class OpaqueStream(torch.utils.data.IterableDataset[int]):
    """An iterable dataset that does not implement ResumableIterable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def indices(batch: Any) -> list[int]:
    """The sample indices of a collated batch from these doubles."""
    return [int(v) for v in batch["idx"]]
