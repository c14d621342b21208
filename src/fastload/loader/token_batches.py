"""Whole batches of token windows, built in the loader's process.

When :class:`fastload.DataLoader` gets a :class:`~fastload.TokenDataset` (or a
``ParquetDataset(tokenizer=...)``, its subclass) with the default collate (or
:func:`~fastload.datasets.tokens.collate_packed`), no worker process starts: a
DataLoader worker would pickle every batch of int64 windows through a pipe (measured:
torch's IPC capped the loader at 0.05x of a plain loop over the mapped shards). The
loader asks the dataset for this rank's remaining plan (:meth:`TokenDataset.rank_plan`:
the same order, World split and resume point as its iterator), cuts it into batches
(the last short one kept unless ``drop_last``), and :class:`TokenBatcher` slices each
batch's windows straight out of the mapped shards into one recycled (pinned, when the
loader feeds CUDA) int64 buffer on a builder thread, a couple of batches ahead:

* ``input_ids`` and ``labels``: contiguous ``int64[b, seq_len]`` (two halves of one
  buffer), converted from the shards' uint16/uint32 by numpy, one slice per window;
  a window that crosses a shard boundary is assembled from its pieces.
* with the dataset's ``position_ids=True`` / ``cu_seqlens=True``: ``position_ids``
  ``int64[b, seq_len]``, and ``cu_seqlens`` (int32, of the flattened ``b*seq_len``
  batch) with ``max_seqlen``, exactly as :func:`collate_packed` makes them.

The batches equal those of torch's path (``transport="pickle"``) byte for byte.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from fastload.datasets.tokens import TokenDataset, collate_packed
from fastload.loader.slabs import SlabPool
from fastload.loader.transport import PlanPrefetcher
from fastload.sampling.plan import shard_of

__all__ = ["TokenBatcher", "token_batcher"]


def token_batcher(
    dataset: Any, transport: str, collate_fn: Callable[..., Any] | None
) -> TokenBatcher | None:
    """A :class:`TokenBatcher` for ``dataset`` when the loader should build its
    batches itself: a TokenDataset, the default collate (or :func:`collate_packed`),
    and a transport other than ``"pickle"``. None otherwise."""
    if transport == "pickle" or not isinstance(dataset, TokenDataset):
        return None
    if collate_fn is not None and collate_fn is not collate_packed:
        return None
    return TokenBatcher(dataset)


class TokenBatcher:
    """Builds batches of ``dataset``'s windows (see the module). ``pin``: allocate
    them in pinned memory (set by the loader when it feeds CUDA), with ``device`` the
    CUDA device the builder thread pins for; ``depth``: batches built ahead."""

    def __init__(
        self, dataset: TokenDataset, pin: bool = False, device: Any = None, depth: int = 2
    ) -> None:
        self.dataset = dataset
        self.pin = pin
        self.device = device
        self.depth = max(1, depth)
        self.slabs = SlabPool()
        self.batches = 0  # batches built
        self.crossing = 0  # windows assembled from pieces of two or more shards
        self._pool: ThreadPoolExecutor | None = None

    # ----------------------------------------------------------------- build
    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.pin:
            return torch.empty(shape, dtype=torch.int64, pin_memory=True)
        n = 1
        for d in shape:
            n *= d
        return self.slabs.tensor(8 * n).view(torch.int64).view(shape)

    def build(self, windows: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch of windows ``windows`` (global window indices, in order)."""
        ds = self.dataset
        source, layout, L = ds.source, ds.layout, ds.seq_len
        ks = np.asarray(windows, dtype=np.int64)
        b = int(ks.size)
        both = self._empty((2, b, L))
        ids_t, labels_t = both[0], both[1]
        out = both.numpy()
        ids, labels = out[0], out[1]
        first = ks * L
        shard = np.searchsorted(layout.token_starts, first, side="right") - 1
        local = first - layout.token_starts[shard]
        fits = first + L + 1 <= layout.token_starts[shard + 1]
        served = {"disk": 0, "ram": 0}
        for s in np.unique(shard[fits]).tolist():
            view, tier = source.token_view(s)
            rows = np.flatnonzero(fits & (shard == s)).tolist()
            for i, lo in zip(rows, local[rows].tolist(), strict=True):
                ids[i] = view[lo : lo + L]
                labels[i] = view[lo + 1 : lo + L + 1]
            served[tier] += len(rows) * (L + 1) * source.dtype.itemsize
            del view
        for tier, nbytes in served.items():
            if nbytes:
                source.count_served(tier, nbytes)
        rows = np.flatnonzero(~fits).tolist()
        if rows:
            buf = np.empty(L + 1, dtype=np.int64)
            for i in rows:
                at = 0
                for s, lo, hi in layout.pieces(int(ks[i])):
                    source.tokens(s, lo, hi, buf[at : at + hi - lo])  # counts what it serves
                    at += hi - lo
                ids[i] = buf[:-1]
                labels[i] = buf[1:]
            self.crossing += len(rows)
        batch: dict[str, torch.Tensor] = {"input_ids": ids_t, "labels": labels_t}
        if ds.position_ids or ds.cu_seqlens:
            self._extras(ks, batch)
        self.batches += 1
        return batch

    def _extras(self, ks: np.ndarray, batch: dict[str, torch.Tensor]) -> None:
        # position_ids and cu_seqlens as TokenDataset.window and collate_packed make them
        ds = self.dataset
        L, b = ds.seq_len, int(ks.size)
        pos_t = self._empty((b, L))
        pos = pos_t.numpy()
        cu_parts = [np.zeros(1, dtype=np.int32)]
        for i, k in enumerate(ks.tolist()):
            pos[i] = ds._positions(k, ds.layout.pieces(k))
            if ds.cu_seqlens:
                starts = np.flatnonzero(pos[i] == 0).astype(np.int32)
                cu_parts.append(np.append(starts[1:], np.int32(L)) + np.int32(i * L))
        if ds.position_ids:
            batch["position_ids"] = pos_t
        if ds.cu_seqlens:
            cu = np.concatenate(cu_parts)
            batch["cu_seqlens"] = torch.from_numpy(cu)
            batch["max_seqlen"] = torch.tensor(int(np.diff(cu).max()), dtype=torch.int32)

    # --------------------------------------------------------------- iterate
    def iterate(self, batch_size: int, drop_last: bool) -> Iterator[Any]:
        """This rank's remaining batches of the epoch the dataset is set to (planned
        now, so a later ``configure`` of the dataset does not move them), built
        ``depth`` ahead on a builder thread."""
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

    def _thread_device(self) -> None:
        dev = self.device
        if dev is not None and getattr(dev, "type", None) == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)  # pinned blocks for the loader's GPU

    def _run(
        self, plan: np.ndarray, batch_size: int, n: int, prefetch: PlanPrefetcher | None
    ) -> Iterator[dict[str, torch.Tensor]]:
        pool = ThreadPoolExecutor(
            1, thread_name_prefix="fastload-tokens", initializer=self._thread_device
        )
        self._pool = pool

        def step(j: int) -> dict[str, torch.Tensor]:
            batch = self.build(plan[j * batch_size : (j + 1) * batch_size])
            if prefetch is not None:
                prefetch.advance()
            return batch

        pending: deque[Future[dict[str, torch.Tensor]]] = deque()
        try:
            if prefetch is not None:
                prefetch.start()
            j = 0
            while True:
                while j < n and len(pending) < self.depth:
                    pending.append(pool.submit(step, j))
                    j += 1
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()
            if not sys.is_finalizing():  # a generator collected at exit: threads are gone
                pool.shutdown(wait=True, cancel_futures=True)
                if prefetch is not None:
                    prefetch.close()
            if self._pool is pool:
                self._pool = None

    def close(self) -> None:
        """Stop the builder thread of a running iteration."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
