"""Worker processes' shared-memory batches, recycled once the loader's process lets go.

A worker that decodes a batch whole (:class:`~fastload.loader.adapters.DecodeBatchAdapter`,
:class:`~fastload.loader.adapters.PixelBatchAdapter`) writes its images into one
shared-memory tensor the loader's process receives. A fresh segment per batch costs
the kernel's work on every page: made, zeroed and faulted in by the worker, mapped by
the loader's process, unmapped by both (8-10 ms of CPU per 64 images of 224x224x3
here, ~6% of their decode; on a VM whose freed memory goes back to the host, each
first touch also faults on the host). :class:`SlabChannel` lets each worker keep a
few segments (*slabs*) and fill one again once nothing in the loader's process refers
to it any more:

* **In the worker** the batch's image tensors are carved from the worker's slabs
  (:meth:`SlabChannel.alloc`); torch's loader then runs :meth:`SlabChannel.collate`
  (fastload's :func:`~fastload.loader.transport.collate_decoded`), which tags the
  batch with the slabs it carries and a sequence number per slab, unique to this
  worker process and this send (``pid << 40 | count``).
* **In the loader's process** :meth:`SlabChannel.adopt` takes the tag off and puts a
  ``weakref.finalize`` on each slab tensor's storage (torch keeps a storage's Python
  object for as long as the storage lives): every tensor, view or array derived from
  the batch keeps it alive, so the finalizer runs only when the caller, a device copy
  and the loader have all let go. It then stores that slab's sequence number in a
  shared-memory table (one aligned 8-byte store: no lock). The batch is handed on as
  torch made it (``is_shared()`` holds). Where torch's pin-memory thread runs (CUDA,
  workers), it copies each batch into pinned memory and drops the shared one before
  the batch reaches :meth:`adopt`, which then releases the slab at once.
* **Back in the worker** a slab is filled again only when the table holds the number
  it was last sent with. A batch that never reaches :meth:`adopt` (an abandoned
  epoch's) leaves its slab out of use for that worker's life, and a number written
  for a slab of an earlier worker process (non-persistent workers) never matches a
  later process's, so a late release cannot free a slab sent since. A worker with no
  free slab and :attr:`slots` in use allocates fresh shared memory, as without this.

What the loader's process cannot see is another process: a batch passed on to one
(a ``torch.multiprocessing`` queue maps the same memory there) may be refilled once
this process lets go of it. Clone such a batch, or pass
``DataLoader(recycle_batches=False)``.

:class:`fastload.DataLoader` sets this up where torch's loader runs fastload's
``collate_decoded`` in worker processes (batches decoded whole into slabs, or images
decoded one by one and stacked into one); see :func:`recycles_worker_batches`.
``DataLoader.worker_slabs`` holds the channel; its :meth:`~SlabChannel.stats` counts
the slabs made and reused.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.loader.transport import _collate_decoded, collate_decoded, shared_batch
from fastload.loader.transport_plan import TransportPlan

__all__ = ["SLAB_SPARE", "SLAB_TAG", "SlabChannel", "recycles_worker_batches", "slab_channel"]

#: The batch key a worker's collate puts its slabs under (taken off by ``adopt``).
SLAB_TAG = "__fastload_slabs__"
#: Slabs a worker keeps beyond torch's ``prefetch_factor``: the batch the caller holds,
#: one in a device copy, one spare.
SLAB_SPARE = 3
_ALIGN = 1 << 20  # slabs are whole MiB, so one serves the epoch's smaller last batch
_COUNTERS = 3  # per worker: slabs allocated, reuses, fresh segments past the slots


def recycles_worker_batches(plan: TransportPlan) -> bool:
    """Whether a loader's worker processes recycle their batch slabs under ``plan``:
    workers run and torch's loader collates with ``collate_decoded`` (``plan.collate
    == "decoded"``), which stacks a batch's images into slabs."""
    return plan.worker_processes > 0 and plan.collate == "decoded"


def slab_channel(
    plan: TransportPlan, adapter: Any, prefetch_factor: int | None, recycle: bool = True
) -> SlabChannel | None:
    """The :class:`SlabChannel` of a loader whose workers recycle their batches
    (``recycle`` and :func:`recycles_worker_batches`), None otherwise; an ``adapter``
    that decodes whole batches itself (``use_slabs``) gets it too. Each worker keeps
    ``prefetch_factor`` (torch's default 2) + :data:`SLAB_SPARE` slabs."""
    if not recycle or not recycles_worker_batches(plan):
        return None
    slots = (2 if prefetch_factor is None else int(prefetch_factor)) + SLAB_SPARE
    channel = SlabChannel(plan.worker_processes, slots)
    use = getattr(adapter, "use_slabs", None)
    if use is not None:
        use(channel)
    return channel


@dataclass
class _Slab:
    storage: torch.UntypedStorage
    nbytes: int
    sent: int = 0  # the sequence number it was last sent with (0: never, or back)


@dataclass
class _WorkerSide:
    pid: int
    worker: int
    slabs: list[_Slab] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # handed out for this batch
    count: int = 0


class SlabChannel:
    """The slab table of one loader's worker processes (see the module docstring).
    ``workers``: torch's worker count; ``slots``: slabs each worker keeps at most."""

    def __init__(self, workers: int, slots: int) -> None:
        self.workers = int(workers)
        self.slots = int(slots)
        # released[w, k]: the sequence number slab k of worker w came back with
        self._released = torch.zeros((self.workers, self.slots), dtype=torch.int64)
        self._released.share_memory_()
        self._counts = torch.zeros((self.workers, _COUNTERS), dtype=torch.int64)
        self._counts.share_memory_()
        self._side: _WorkerSide | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_side"] = None  # a worker's slabs are its own
        return state

    # ------------------------------------------------------------ worker side
    def _worker(self) -> _WorkerSide | None:
        side = self._side
        if side is not None and side.pid == os.getpid():
            return side
        info = torch.utils.data.get_worker_info()
        if info is None or not 0 <= info.id < self.workers:
            return None
        self._side = _WorkerSide(os.getpid(), int(info.id))
        return self._side

    def begin(self) -> None:
        """A worker starts a batch: slabs handed out for one that never reached the
        collate (its decode raised) are free again."""
        side = self._worker()
        if side is not None:
            side.pending.clear()

    def alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of ``shape`` in shared memory: in a worker, carved from one of
        its free slabs (or a new one); elsewhere, or with every slot in use, fresh."""
        side = self._worker()
        n = 1
        for d in shape:
            n *= int(d)
        if side is None or n <= 0:
            return shared_batch(shape)
        released = self._released[side.worker].numpy()
        counts = self._counts[side.worker].numpy()
        best = -1
        for k, slab in enumerate(side.slabs):
            free = slab.sent == 0 or int(released[k]) == slab.sent
            fits = n <= slab.nbytes <= 2 * n + _ALIGN and k not in side.pending
            if free and fits and (best < 0 or slab.nbytes < side.slabs[best].nbytes):
                best = k
        if best < 0 and len(side.slabs) < self.slots:
            size = -(-n // _ALIGN) * _ALIGN
            side.slabs.append(_Slab(torch.UntypedStorage._new_shared(size), size))
            best = len(side.slabs) - 1
            counts[0] += 1
        elif best >= 0:
            counts[1] += 1
        if best < 0:
            counts[2] += 1
            return shared_batch(shape)
        slab = side.slabs[best]
        slab.sent = 0
        side.pending.append(best)
        flat = torch.empty(0, dtype=torch.uint8).set_(slab.storage)
        return flat[:n].view(shape)

    def collate(self, samples: Any) -> Any:
        """``collate_decoded(samples)``, images it stacks (samples decoded one by one)
        also into slabs, tagged with the slabs the batch carries."""
        side = self._worker()
        if side is None:
            return collate_decoded(samples)
        batch = _collate_decoded(samples, False, self.alloc)
        if not side.pending:
            return batch
        tags: list[tuple[str, int, int, int]] = []
        ptrs = {side.slabs[k].storage.data_ptr(): k for k in side.pending}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                k = ptrs.pop(value.untyped_storage().data_ptr(), None)
                if k is not None:
                    side.count += 1
                    seq = (side.pid << 40) | side.count
                    side.slabs[k].sent = seq
                    tags.append((name, side.worker, k, seq))
        side.pending.clear()  # the rest were not sent: free again (sent == 0)
        if tags:
            batch[SLAB_TAG] = tags
        return batch

    # ----------------------------------------------------------- loader side
    def adopt(self, batch: Any) -> Any:
        """In the loader's process: take the tag off ``batch`` and give each slab's
        tensor a finalizer that releases the slab when nothing refers to it."""
        if not isinstance(batch, dict) or SLAB_TAG not in batch:
            return batch
        tags = batch.pop(SLAB_TAG)
        released = self._released.numpy()
        pid = os.getpid()
        for name, worker, k, seq in tags:
            t = batch.get(name)
            if isinstance(t, torch.Tensor) and not t.is_shared():
                # torch's pin-memory thread copied the slab into pinned memory and let
                # go of it before handing the batch on: free now
                _release(released, int(worker), int(k), int(seq), pid)
            elif isinstance(t, torch.Tensor):
                # torch keeps a storage's Python object as long as the storage lives
                # (any tensor or view of it), so this runs when the last one goes
                end = weakref.finalize(
                    t.untyped_storage(), _release, released, int(worker), int(k), int(seq), pid
                )
                end.atexit = False
        return batch

    def stats(self) -> dict[str, int]:
        """Over every worker so far: ``allocated`` slabs, ``reused`` slabs, ``fresh``
        segments made because every slot was in use."""
        c = self._counts.numpy().sum(axis=0)
        return {"allocated": int(c[0]), "reused": int(c[1]), "fresh": int(c[2])}


def _release(released: np.ndarray, worker: int, k: int, seq: int, pid: int) -> None:
    # a finalizer (any thread, any allocation): one aligned 8-byte store, no lock. Only
    # in the process that adopted the batch: a child forked meanwhile holds copies of
    # the same references, and its letting go says nothing of the parent's
    if os.getpid() == pid:
        released[worker, k] = seq
