"""Whole batches of token windows, built in the loader's process.

When :class:`fastload.DataLoader` gets a :class:`~fastload.TokenDataset` (or a
``ParquetDataset(tokenizer=...)``, its subclass) with the default collate (or
:func:`~fastload.datasets.tokens.collate_packed`), no worker process starts: a
DataLoader worker would pickle every batch of int64 windows through a pipe (measured:
torch's IPC capped the loader at 0.02-0.05x of a plain loop over the mapped shards). The
loader asks the dataset for this rank's remaining plan (:meth:`TokenDataset.rank_plan`:
the same order, World split and resume point as its iterator), cuts it into batches
(the last short one kept unless ``drop_last``), and :class:`TokenBatcher` slices each
batch's windows straight out of the mapped shards into one recycled (pinned, when the
loader feeds CUDA) int64 buffer when the caller asks for it (about 20 µs for 8 x 2,049
tokens; the shards themselves are staged ahead by a :class:`PlanPrefetcher`):

* ``input_ids`` and ``labels``: contiguous ``int64[b, seq_len]`` (two halves of one
  buffer), converted from the shards' uint16/uint32 by numpy, one slice per window;
  a window that crosses a shard boundary is assembled from its pieces.
* with the dataset's ``position_ids=True`` / ``cu_seqlens=True``: ``position_ids``
  ``int64[b, seq_len]``, and ``cu_seqlens`` (int32, of the flattened ``b*seq_len``
  batch) with ``max_seqlen``, exactly as :func:`collate_packed` makes them.

The batches equal those of torch's path (``transport="pickle"``) byte for byte.

``TokenBatcher(depth=2)`` would build ahead on a builder thread (:class:`_Ahead`); the
loader uses ``depth=0``, measured faster here: with a thread, batches cost 41-117 µs
each on the 2 loaded cores of the benchmark machine against 25-46 µs in the caller's
thread (every handoff waits for the other thread to get the GIL and a CPU), and the
benchmark's ratio to a plain loop fell from 1.10x to 0.54x
(``benchmarks/bench_text.py --only loader``, docs/benchmarks/text.md).
"""

from __future__ import annotations

import bisect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from fastload.datasets.tokens import TokenDataset, collate_packed
from fastload.loader.slabs import SlabPool
from fastload.loader.transport import PlanPrefetcher
from fastload.sampling.plan import shard_of

__all__ = ["TokenBatcher", "token_batcher"]


def token_batcher(
    dataset: Any,
    transport: str,
    collate_fn: Callable[..., Any] | None,
    plan_in_workers: bool | None = None,
) -> TokenBatcher | None:
    """A :class:`TokenBatcher` for ``dataset`` when the loader should build its
    batches itself: a TokenDataset, the default collate (or :func:`collate_packed`),
    a transport other than ``"pickle"``, and ``plan_in_workers`` not True (True keeps
    worker processes, which then build and pickle the batches). None otherwise."""
    if transport == "pickle" or plan_in_workers or not isinstance(dataset, TokenDataset):
        return None
    if collate_fn is not None and collate_fn is not collate_packed:
        return None
    return TokenBatcher(dataset)


class TokenBatcher:
    """Builds batches of ``dataset``'s windows (see the module). ``pin``: allocate
    them in pinned memory (set by the loader when it feeds CUDA), with ``device`` the
    CUDA device pinned blocks are made for; ``depth``: batches built ahead on a builder
    thread (0: each in the caller's thread when it asks, what the loader uses)."""

    def __init__(
        self, dataset: TokenDataset, pin: bool = False, device: Any = None, depth: int = 0
    ) -> None:
        self.dataset = dataset
        self.pin = pin
        self.device = device
        self.depth = max(0, depth)
        self.slabs = SlabPool()
        self._starts = dataset.layout.token_starts.tolist()  # bisect beats numpy for a few
        self.batches = 0  # batches built
        self.crossing = 0  # windows assembled from pieces of two or more shards
        self.built_ahead = 0  # batches the builder thread made (the rest: the caller)
        self._ahead: _Ahead | None = None

    # ----------------------------------------------------------------- build
    def _empty(self, shape: tuple[int, ...]) -> np.ndarray:
        # an int64 array over pinned or recycled memory; torch.from_numpy of it (or of
        # a view of it) keeps that memory alive
        if self.pin:
            dev = self.device
            if dev is not None and dev.index is not None:
                with torch.cuda.device(dev):  # pinned blocks for the loader's GPU
                    return torch.empty(shape, dtype=torch.int64, pin_memory=True).numpy()
            return torch.empty(shape, dtype=torch.int64, pin_memory=True).numpy()
        n = 1
        for d in shape:
            n *= d
        return self.slabs.tensor(8 * n).numpy().view(np.int64).reshape(shape)

    def build(self, windows: np.ndarray | list[int]) -> dict[str, torch.Tensor]:
        """The batch of windows ``windows`` (global window indices, in order)."""
        ds = self.dataset
        source, L = ds.source, ds.seq_len
        starts = self._starts
        ks = windows.tolist() if isinstance(windows, np.ndarray) else [int(k) for k in windows]
        b = len(ks)
        out = self._empty((2, b, L))
        ids, labels = out[0], out[1]
        itemsize = source.dtype.itemsize
        crossing = []
        i = 0
        while i < b:
            a = ks[i] * L
            s = bisect.bisect_right(starts, a) - 1
            end = starts[s + 1]
            if a + L + 1 > end:
                crossing.append(i)  # runs into the next shard
                i += 1
                continue
            # a run of consecutive windows inside shard s is one slice (unshuffled order)
            j = i + 1
            while j < b and ks[j] == ks[j - 1] + 1 and (ks[j] + 1) * L + 1 <= end:
                j += 1
            view, tier = source.token_view(s)
            lo, r = a - starts[s], j - i
            ids[i:j] = view[lo : lo + r * L].reshape(r, L)
            labels[i:j] = view[lo + 1 : lo + 1 + r * L].reshape(r, L)
            source.count_served(tier, r * (L + 1) * itemsize)  # as TokenDataset.window counts
            i = j
        if crossing:
            buf = np.empty(L + 1, dtype=np.int64)
            for i in crossing:
                at = 0
                for s, lo, hi in ds.layout.pieces(ks[i]):
                    source.tokens(s, lo, hi, buf[at : at + hi - lo])  # counts what it serves
                    at += hi - lo
                ids[i] = buf[:-1]
                labels[i] = buf[1:]
            self.crossing += len(crossing)
        batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if ds.position_ids or ds.cu_seqlens:
            self._extras(np.asarray(ks, dtype=np.int64), batch)
        self.batches += 1
        return batch

    def _extras(self, ks: np.ndarray, batch: dict[str, torch.Tensor]) -> None:
        # position_ids and cu_seqlens as TokenDataset.window and collate_packed make them
        ds = self.dataset
        L, b = ds.seq_len, int(ks.size)
        pos = self._empty((b, L))
        cu_parts = [np.zeros(1, dtype=np.int32)]
        for i, k in enumerate(ks.tolist()):
            pos[i] = ds._positions(k, ds.layout.pieces(k))
            if ds.cu_seqlens:
                starts = np.flatnonzero(pos[i] == 0).astype(np.int32)
                cu_parts.append(np.append(starts[1:], np.int32(L)) + np.int32(i * L))
        if ds.position_ids:
            batch["position_ids"] = torch.from_numpy(pos)
        if ds.cu_seqlens:
            cu = np.concatenate(cu_parts)
            batch["cu_seqlens"] = torch.from_numpy(cu)
            batch["max_seqlen"] = torch.tensor(int(np.diff(cu).max()), dtype=torch.int32)

    # --------------------------------------------------------------- iterate
    def iterate(self, batch_size: int, drop_last: bool) -> Iterator[Any]:
        """This rank's remaining batches of the epoch the dataset is set to (planned
        now, so a later ``configure`` of the dataset does not move them), each built
        when asked for, or up to ``depth`` ahead by a builder thread (:class:`_Ahead`)."""
        ds = self.dataset
        plan = ds.rank_plan()
        n = int(plan.size) // batch_size
        if plan.size % batch_size and not drop_last:
            n += 1
        prefetch = None
        if n and ds.prefetch_shards:
            # the plan's shards in order of first use, staged ahead of the batches
            shards = shard_of(plan, ds.layout.shard_windows)
            _, first = np.unique(shards, return_index=True)
            first = np.sort(first)
            prefetch = PlanPrefetcher(
                ds.source,
                shards[first].tolist(),
                ds.prefetch_shards,
                first_batch=(first // batch_size).tolist(),
                batches_ahead=self.depth,
            )
        return self._run(plan, batch_size, n, prefetch)

    def _run(
        self, plan: np.ndarray, batch_size: int, n: int, prefetch: PlanPrefetcher | None
    ) -> Iterator[dict[str, torch.Tensor]]:
        windows = plan.tolist()
        lock = threading.Lock()  # one build at a time: the counters and prefetch schedule

        def step(j: int) -> dict[str, torch.Tensor]:
            with lock:
                batch = self.build(windows[j * batch_size : (j + 1) * batch_size])
                if prefetch is not None:
                    prefetch.advance()
            return batch

        ahead = _Ahead(step, n, self.depth)
        self._ahead = ahead
        try:
            if prefetch is not None:
                prefetch.start()
            ahead.start()
            for j in range(n):
                yield ahead.get(j)
        finally:
            if not sys.is_finalizing():  # a generator collected at exit: threads are gone
                ahead.close()
                if prefetch is not None:
                    prefetch.close()
            self.built_ahead += ahead.by_thread
            if self._ahead is ahead:
                self._ahead = None

    def close(self) -> None:
        """Stop the builder thread of a running iteration."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()


class _Ahead:
    """Batches ``0..n-1`` made by ``build(j)`` for a caller that takes them in order:
    a builder thread stays up to ``depth`` batches ahead of the caller (none with
    ``depth=0``), and a caller whose next batch nobody has started builds it itself
    instead of waiting.

    A batch takes tens of microseconds to slice, about what handing it over between
    threads costs under the GIL (measured: 50 us a batch through a Future), so the
    thread only helps while the caller leaves the GIL (a device step, I/O); the
    caller never waits for a batch that is not being built. A build's exception is
    raised to the caller at that batch."""

    def __init__(self, build: Callable[[int], Any], n: int, depth: int) -> None:
        self._build = build
        self.n = n
        self.depth = max(0, depth)
        self._cond = threading.Condition(threading.Lock())
        self._claimed = 0  # batches 0.._claimed-1 are built or being built
        self._taken = 0  # batches handed to the caller
        self._ready: dict[int, tuple[bool, Any]] = {}
        self._stop = False
        self.by_thread = 0  # batches the builder thread made
        self._thread = threading.Thread(target=self._run, name="fastload-tokens", daemon=True)

    def start(self) -> None:
        """Start the builder thread."""
        if self.n and self.depth:
            self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while (
                    not self._stop
                    and self._claimed < self.n
                    and self._claimed - self._taken >= self.depth
                ):
                    cond.wait()
                if self._stop or self._claimed >= self.n:
                    return
                j = self._claimed
                self._claimed += 1
            try:
                result: tuple[bool, Any] = (True, self._build(j))
            except BaseException as e:  # raised to the caller at batch j
                result = (False, e)
            with cond:
                self._ready[j] = result
                self.by_thread += 1
                cond.notify_all()

    def get(self, k: int) -> Any:
        """Batch ``k`` (``k`` is the next one: the caller takes them in order)."""
        cond = self._cond
        mine = False
        with cond:
            if k not in self._ready and self._claimed == k:
                self._claimed += 1
                mine = True
            else:
                while k not in self._ready:
                    cond.wait()
                ok, value = self._ready.pop(k)
        if mine:
            try:
                value = self._build(k)
            finally:
                self._took(k)
            return value
        self._took(k)
        if not ok:
            raise value
        return value

    def _took(self, k: int) -> None:
        with self._cond:
            self._taken = k + 1
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the builder thread (after the build it is in) and drop built batches."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        self._ready.clear()
