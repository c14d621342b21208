"""Whole batches of token windows, built in the loader's process.

When :class:`fastload.DataLoader` gets a :class:`~fastload.TokenDataset` (or a
:class:`~fastload.ParquetTokenDataset`, its subclass) with the default collate (or
:func:`~fastload.text.collate_packed`), no worker process starts: a
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
  batch) with ``max_seqlen`` (an int), exactly as :func:`collate_packed` makes them.
* over a dataset of chat examples (per-token flags): ``labels`` -100 where the
  shifted token is not trained; with ``labels="hf"`` the Hugging Face fields instead
  (unshifted ``labels`` with -100, ``attention_mask``), window by window as
  :meth:`TokenDataset.window` makes them.

The batches equal those of torch's path (``transport="pickle"``) byte for byte.

Each batch is built in the caller's thread when it asks: a builder thread a few
batches ahead measured slower (41-117 µs a batch on the 2 loaded cores of the
benchmark machine against 25-46 µs in the caller's thread: every handoff waits for
the other thread to get the GIL and a CPU, and slicing is cheaper than that; the
benchmark's ratio to a plain loop fell from 1.10x to 0.54x,
``benchmarks/bench_text.py --only loader``, docs/benchmarks/text.md), so there is none.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch

from fastload.loader.slabs import SlabPool, shared_pool
from fastload.loader.transport import PlanPrefetcher
from fastload.sampling.plan import shard_of
from fastload.text import TokenDataset, collate_packed
from fastload.text.packing import TRAIN
from fastload.text.tokens import hf_labels, shifted_labels

__all__ = ["TokenBatcher", "builds_token_batches", "token_batcher"]


class _Trained(dict[int, np.ndarray]):
    """Flags of a window without a mask (every token trained), one array per length."""

    def __missing__(self, n: int) -> np.ndarray:
        flags = np.full(n, TRAIN, dtype=np.uint8)
        flags.flags.writeable = False
        self[n] = flags
        return flags


_ALL_TRAINED = _Trained()


def builds_token_batches(
    dataset: Any,
    transport: str,
    collate_fn: Callable[..., Any] | None,
    plan_in_workers: bool | None = None,
) -> bool:
    """Whether the loader should build ``dataset``'s batches itself: a TokenDataset,
    the default collate (or :func:`collate_packed`), a transport other than
    ``"pickle"``, and ``plan_in_workers`` not True (True keeps worker processes, which
    then build and pickle the batches)."""
    if transport == "pickle" or plan_in_workers or not isinstance(dataset, TokenDataset):
        return False
    return collate_fn is None or collate_fn is collate_packed


def token_batcher(
    dataset: Any,
    transport: str,
    collate_fn: Callable[..., Any] | None,
    plan_in_workers: bool | None = None,
) -> TokenBatcher | None:
    """A :class:`TokenBatcher` for ``dataset`` when :func:`builds_token_batches`,
    None otherwise."""
    if not builds_token_batches(dataset, transport, collate_fn, plan_in_workers):
        return None
    return TokenBatcher(dataset)


class TokenBatcher:
    """Builds batches of ``dataset``'s windows (see the module). ``pin``: allocate
    them in pinned memory (set by the loader when it feeds CUDA), with ``device`` the
    CUDA device pinned blocks are made for."""

    def __init__(self, dataset: TokenDataset, pin: bool = False, device: Any = None) -> None:
        self.dataset = dataset
        self.pin = pin
        self.device = device
        self.slabs: SlabPool = shared_pool()  # shared by the loaders of this process
        self._starts = dataset.layout.token_starts.tolist()  # bisect beats numpy for a few
        self.batches = 0  # batches built
        self.crossing = 0  # windows assembled from pieces of two or more shards
        self._running: Generator[Any, None, None] | None = None  # what close() ends

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

    def build(self, windows: np.ndarray | list[int]) -> dict[str, Any]:
        """The batch of windows ``windows`` (global window indices, in order)."""
        ds = self.dataset
        source, L = ds.source, ds.seq_len
        starts = self._starts
        ks = windows.tolist() if isinstance(windows, np.ndarray) else [int(k) for k in windows]
        if ds.labels == "hf":
            return self._build_hf(ks)
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
        if source.has_mask:  # chat data: -100 where the shifted token is not trained
            buf = np.empty(L + 1, dtype=np.int64)
            for i, k in enumerate(ks):
                pieces = ds.layout.pieces(k)
                buf[:-1] = ids[i]
                buf[-1] = labels[i, -1]
                labels[i] = shifted_labels(buf, ds.window_flags(pieces, L + 1))
        batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if ds.position_ids or ds.cu_seqlens:
            self._extras(np.asarray(ks, dtype=np.int64), batch)
        self.batches += 1
        return batch

    def _build_hf(self, ks: list[int]) -> dict[str, Any]:
        # labels="hf": unshifted labels, attention_mask (and position_ids, cu_seqlens),
        # each window sliced from its shard's views; one crossing shards from its pieces
        ds = self.dataset
        source, L, b = ds.source, ds.seq_len, len(ks)
        starts = self._starts
        out = self._empty((3, b, L))
        ids, labels, attention = out[0], out[1], out[2]
        per_window = L * source.dtype.itemsize + (L if source.has_mask else 0)
        offsets = np.arange(L, dtype=np.int64)
        for i, k in enumerate(ks):
            a = k * L
            s = bisect.bisect_right(starts, a) - 1
            if a + L > starts[s + 1]:
                pieces = ds.layout.pieces(k)
                at = 0
                for sh, lo, hi in pieces:
                    source.tokens(sh, lo, hi, ids[i, at : at + hi - lo])  # counts it
                    at += hi - lo
                flags = ds.window_flags(pieces, L)
                pos = ds._positions(k, pieces)
                self.crossing += 1
            else:
                tokens, docs, shard_flags, tier = source.shard_views(s)
                lo = a - starts[s]
                ids[i] = tokens[lo : lo + L]
                flags = shard_flags[lo : lo + L] if shard_flags is not None else _ALL_TRAINED[L]
                t = offsets + lo
                begin = docs[np.searchsorted(docs, t, side="right") - 1]
                pos = t - np.maximum(begin, lo)
                source.count_served(tier, per_window)  # as TokenDataset.window counts
            labels[i], attention[i] = hf_labels(ids[i], flags, pos)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy(attention),
        }
        if ds.position_ids or ds.cu_seqlens:
            self._extras(np.asarray(ks, dtype=np.int64), batch)
        self.batches += 1
        return batch

    def _extras(self, ks: np.ndarray, batch: dict[str, Any]) -> None:
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
            batch["max_seqlen"] = int(np.diff(cu).max())

    # --------------------------------------------------------------- iterate
    def iterate(self, batch_size: int, drop_last: bool) -> Iterator[Any]:
        """This rank's remaining batches of the epoch the dataset is set to (planned
        now, so a later ``configure`` of the dataset does not move them), each built
        when asked for."""
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
            )
        self._running = self._run(plan, batch_size, n, prefetch)
        return self._running

    def _run(
        self, plan: np.ndarray, batch_size: int, n: int, prefetch: PlanPrefetcher | None
    ) -> Generator[dict[str, Any], None, None]:
        windows = plan.tolist()
        try:
            if prefetch is not None:
                prefetch.start()
            for j in range(n):
                batch = self.build(windows[j * batch_size : (j + 1) * batch_size])
                if prefetch is not None:
                    prefetch.advance()
                yield batch
        finally:
            # a generator collected at exit: the prefetch threads are gone
            if prefetch is not None and not sys.is_finalizing():
                prefetch.close()

    def close(self) -> None:
        """End the running iteration (its prefetch threads stop)."""
        running, self._running = self._running, None
        if running is not None:
            running.close()
