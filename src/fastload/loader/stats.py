"""Loader statistics: how long the caller waited for each batch, and the dataset's I/O.

Two kinds of numbers:

* **Waits** are measured in the main process, around the caller's ``next()``: from
  the moment the training loop asks for a batch to the moment it gets it (on the
  device, when the loader feeds one). They are the "GPU hunger": a loader that
  keeps up shows waits near zero.
* **I/O counters** come from the dataset, through the :class:`IOStatsSource`
  protocol. With worker processes each worker holds its own copy of the dataset,
  so each worker publishes its counters into a row of a small shared-memory
  float64 array (:class:`WorkerCounters`) after every item it produces; the main
  process sums the rows of every worker generation it started plus its own copy's
  counters. Publishing happens before the item is returned to torch, so by the
  time the caller has a batch, the counters for the work behind it are visible.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from fastload.loader.device import first_tensor

__all__ = [
    "TIER_KEYS",
    "IOAccount",
    "IOStatsSource",
    "LoaderStats",
    "WaitRecorder",
    "WorkerCounters",
    "count_samples",
    "has_io_stats",
    "io_source",
]

# The counter names fastload's datasets report; others are carried through as they are.
TIER_KEYS = ("remote", "disk", "ram")


@runtime_checkable
class IOStatsSource(Protocol):
    """A dataset that reports I/O counters to :meth:`fastload.DataLoader.stats`.

    ``io_stats()`` returns cumulative counters of *this process's* copy of the
    dataset since it was created, as ``{name: number}`` with the same keys on every
    call. Names the loader understands: ``remote_bytes``, ``disk_bytes``,
    ``ram_bytes`` (bytes served per tier), ``cache_hits``, ``cache_misses``; any
    other key is summed and reported as it is. It must be cheap (it is called once
    per item in worker processes).
    """

    def io_stats(self) -> Mapping[str, int | float]: ...


def has_io_stats(dataset: object) -> bool:
    """Whether ``dataset`` implements :class:`IOStatsSource`."""
    return callable(getattr(dataset, "io_stats", None))


def io_source(dataset: object, depth: int = 3) -> Any:
    """What reports ``dataset``'s I/O counters: the dataset itself when it implements
    :class:`IOStatsSource`, else its ``source`` (a
    :class:`~fastload.datasets.source.ShardSource`, as the drop-ins and every
    :class:`~fastload.loader.transport_plan.BatchTransportDataset` have), else the same
    of the dataset it wraps (``.dataset``: torch's ``Subset``; ``._dataset``:
    torchvision's ``wrap_dataset_for_transforms_v2``), up to ``depth`` wrappers; None
    when nothing does."""
    if has_io_stats(dataset):
        return dataset
    source = getattr(dataset, "source", None)
    if has_io_stats(source):
        return source
    if depth > 0:
        for name in ("dataset", "_dataset"):
            inner = getattr(dataset, name, None)
            if inner is not None and inner is not dataset:
                found = io_source(inner, depth - 1)
                if found is not None:
                    return found
    return None


class WorkerCounters:
    """Shared-memory counter rows, one per DataLoader worker, for one worker generation.

    Created in the main process and carried into the workers with the dataset
    wrapper; a worker calls :meth:`start` before its first item and then
    :meth:`publish` to write the increase of its dataset copy's counters since then
    (so counters inherited from the main process's copy are not counted twice).
    """

    def __init__(self, keys: tuple[str, ...], num_workers: int) -> None:
        self.keys = keys
        self._index = {k: i for i, k in enumerate(keys)}
        self.rows = torch.zeros((max(num_workers, 1), len(keys)), dtype=torch.float64)
        self.rows.share_memory_()
        self._baseline: dict[str, float] | None = None  # set in the worker process

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ran in this process."""
        return self._baseline is not None

    def start(self, counters: Mapping[str, int | float]) -> None:
        """Note this worker's starting values (once per process, before its first item)."""
        if self._baseline is None:
            self._baseline = {k: float(counters.get(k, 0)) for k in self.keys}

    def publish(self, worker_id: int, counters: Mapping[str, int | float]) -> None:
        """Write ``counters`` minus this worker's starting values into row ``worker_id``."""
        if self._baseline is None:
            raise RuntimeError("WorkerCounters.publish before start in this process")
        row = self.rows[worker_id].numpy()
        for k, i in self._index.items():
            row[i] = float(counters.get(k, 0)) - self._baseline[k]

    def totals(self) -> dict[str, float]:
        """Sum of every worker's row."""
        sums = self.rows.numpy().sum(axis=0)
        return {k: float(sums[i]) for k, i in self._index.items()}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_baseline"] = None  # every worker process starts its own baseline
        return state


class WaitRecorder:
    """Main-process counters: per-batch waits, samples, active wall time."""

    def __init__(self) -> None:
        self.waits = array("d")
        self.samples = 0
        self.wall_s = 0.0
        self.first_wait_s: float | None = None

    def record(self, wait_s: float, samples: int) -> None:
        """Record one batch the caller waited ``wait_s`` seconds for."""
        if self.first_wait_s is None:
            self.first_wait_s = wait_s
        self.waits.append(wait_s)
        self.samples += samples

    def add_wall(self, seconds: float) -> None:
        """Add ``seconds`` of iteration (from the first request to the last batch)."""
        self.wall_s += seconds


@dataclass(frozen=True)
class LoaderStats:
    """What :meth:`fastload.DataLoader.stats` returns.

    Times are seconds. ``wait_*`` are over batches handed to the caller (the time
    the training loop was blocked in ``next()``); ``first_wait_s`` is the first
    batch's (start-up). ``io`` holds the summed dataset counters (empty when the
    dataset does not implement :class:`IOStatsSource`), ``bytes_by_tier`` the
    ``<tier>_bytes`` counters and ``cache_hit_ratio`` hits / (hits + misses).
    """

    batches: int
    samples: int
    wall_time_s: float
    samples_per_s: float
    wait_total_s: float
    wait_mean_s: float
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    first_wait_s: float | None
    io: dict[str, float] = field(default_factory=dict)
    bytes_by_tier: dict[str, float] = field(default_factory=dict)
    cache_hit_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return asdict(self)

    @classmethod
    def build(cls, recorder: WaitRecorder, io: dict[str, float]) -> LoaderStats:
        """Summarise ``recorder`` and the summed dataset counters ``io``."""
        waits = np.frombuffer(recorder.waits, dtype=np.float64) if recorder.waits else None
        if waits is None:
            total = mean = p50 = p95 = peak = 0.0
        else:
            total = float(waits.sum())
            mean = total / len(waits)
            p50, p95 = (float(v) for v in np.percentile(waits, [50, 95]))
            peak = float(waits.max())
        by_tier = {t: io[f"{t}_bytes"] for t in TIER_KEYS if f"{t}_bytes" in io}
        hits, misses = io.get("cache_hits"), io.get("cache_misses")
        ratio = None
        if hits is not None and misses is not None and hits + misses > 0:
            ratio = hits / (hits + misses)
        wall = recorder.wall_s
        return cls(
            batches=len(recorder.waits),
            samples=recorder.samples,
            wall_time_s=wall,
            samples_per_s=recorder.samples / wall if wall > 0 else 0.0,
            wait_total_s=total,
            wait_mean_s=mean,
            wait_p50_s=p50,
            wait_p95_s=p95,
            wait_max_s=peak,
            first_wait_s=recorder.first_wait_s,
            io=io,
            bytes_by_tier=by_tier,
            cache_hit_ratio=ratio,
        )


def count_samples(batch: Any, default: int) -> int:
    """Samples in a batch whose indices the loader did not see (an iterable dataset's):
    the length of its first field when that is a list or tuple (``tuple(zip(*items))``
    of torchvision's detection recipe: images, targets), the length of a list of
    samples, else the first dimension of its first tensor, else the length of its
    first field's list, else ``default``."""
    if isinstance(batch, (list, tuple)) and batch:
        head = batch[0]
        if isinstance(head, (list, tuple)):
            return len(head)
        if not isinstance(head, torch.Tensor) and first_tensor(head) is not None:
            return len(batch)  # a list of samples (dicts or tuples holding tensors)
    first = first_tensor(batch)
    if first is not None and first.ndim > 0:
        return int(first.shape[0])
    if isinstance(batch, Mapping) and batch:
        head = next(iter(batch.values()))
        if isinstance(head, Sequence) and not isinstance(head, (str, bytes)):
            return len(head)
    return default


class IOAccount:
    """A loader's I/O counters since it was made: its own process's copy of the
    dataset (less what they were then: that copy may have been used), plus every
    worker generation, live (:attr:`live`, rows in shared memory) or finished
    (folded into plain numbers)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.source = io_source(dataset)  # what reports the counters, if anything
        self.base: dict[str, float] = {}
        if self.source is not None:
            self.base = {k: float(v) for k, v in self.source.io_stats().items()}
        self.keys: tuple[str, ...] = tuple(sorted(self.base))
        self.live: list[WorkerCounters] = []  # live worker generations
        self.retired: dict[str, float] = {}  # counters of finished generations

    def generation(self, procs: int) -> WorkerCounters:
        """Fresh rows for a new generation of ``procs`` worker processes."""
        counters = WorkerCounters(self.keys, procs)
        self.live.append(counters)
        return counters

    def retire(self, counters: WorkerCounters) -> None:
        """torch has shut the generation's workers down: fold its final rows into
        plain numbers and drop the shared memory (one segment per epoch otherwise)."""
        if counters in self.live:
            self.live.remove(counters)
            for k, v in counters.totals().items():
                self.retired[k] = self.retired.get(k, 0.0) + v

    def totals(self) -> dict[str, float]:
        """The counters summed over the loader's process and every worker ({} for a
        dataset without counters)."""
        if not self.keys:
            return {}
        own = self.source.io_stats()
        totals = {k: float(v) - self.base.get(k, 0.0) for k, v in own.items()}
        for k, v in self.retired.items():
            totals[k] = totals.get(k, 0.0) + v
        for counters in self.live:
            for k, v in counters.totals().items():
                totals[k] = totals.get(k, 0.0) + v
        return totals
