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
  (unshifted ``labels`` with -100, ``attention_mask``), as :meth:`TokenDataset.window`
  makes them but for the whole ``[b, seq_len]`` batch at once: the flags are sliced
  like the tokens, each run's document starts (two ``searchsorted``) mark where
  positions restart, and labels, mask, ``position_ids`` and ``cu_seqlens`` follow
  from the marks and flags with a few numpy operations per batch (measured 10-12x the
  per-item path, ``benchmarks/bench_text.py --only loader --labels hf``); a window
  across shards alone takes the per-window path.

The batches equal those of torch's path (``transport="pickle"``) byte for byte.

Over a :class:`~fastload.ParquetTokenDataset` made with ``stream=True`` whose first
pass still runs (:func:`streams_first_pass`), nothing of the token shards is opened
when the loader is made: the unshuffled one-node epoch's batches come from
:meth:`ParquetTokenDataset.stream_steps` (:meth:`TokenBatcher.build_span` reads each
full step's consecutive windows out of the published pieces, the same arrays
:meth:`TokenBatcher.build` makes from the shards), then, once the first pass is done,
from the finished dataset's plan where the pieces left off. The loader's ``len()``
raises ``TypeError`` meanwhile (the window count is known only at the pass's end:
:func:`length_error`); a shuffled epoch or a multi-node world waits for the first
pass, as the plan's reasons say (:func:`first_pass_note`).

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
from typing import Any, cast

import numpy as np
import torch

from fastload.loader.slabs import SlabPool, shared_pool
from fastload.loader.transport import PlanPrefetcher
from fastload.sampling.plan import shard_of
from fastload.text import TokenDataset, collate_packed
from fastload.text.packing import PAD, TRAIN

__all__ = [
    "TokenBatcher",
    "builds_token_batches",
    "first_pass_note",
    "length_error",
    "open_source",
    "streams_first_pass",
    "token_batcher",
]


def _first_pass_running(dataset: Any) -> bool:
    running = getattr(type(dataset), "first_pass_running", None)
    return callable(running) and bool(dataset.first_pass_running())


def streams_first_pass(dataset: Any) -> bool:
    """Whether an iteration of ``dataset`` started now streams a first pass still under
    way (a ``ParquetTokenDataset(stream=True)``: :meth:`~ParquetTokenDataset.streams`)."""
    return _first_pass_running(dataset) and bool(dataset.streams())


def open_source(dataset: Any) -> Any:
    """``dataset.source``, or None while a first pass runs (asking would wait for the
    token shards)."""
    return None if _first_pass_running(dataset) else getattr(dataset, "source", None)


def first_pass_note(dataset: Any, tokens: bool = True) -> str | None:
    """The loader plan's reason about a first pass still under way (None for any
    other dataset). ``tokens``: the loader builds the token batches itself."""
    if not _first_pass_running(dataset):
        return None
    head = "ParquetTokenDataset(stream=True) with its first pass running: "
    if not tokens:
        return head + (
            "only the loader's own token batches (default collate, no plan_in_workers, "
            "transport other than 'pickle') stream it: these wait for the first pass"
        )
    if dataset.streams():
        return head + (
            "the unshuffled one-node first epoch is served as its pieces are tokenized, "
            "then from the finished dataset's plan; len() raises TypeError until then"
        )
    why = "a shuffled epoch" if dataset.shuffle else "a multi-node world"
    return head + f"{why} needs the window count: its batches wait for the first pass"


def length_error(dataset: Any) -> str:
    """Why a loader over ``dataset`` has no ``len()`` (the message of its TypeError)."""
    if streams_first_pass(dataset):
        return (
            f"len() of a fastload.DataLoader over {type(dataset).__name__}(stream=True) is "
            "not known while its first pass tokenizes (batches are served meanwhile); it "
            "is known once the pass ends (dataset.first_pass_running() is False)"
        )
    return f"{type(dataset).__name__} has no len(); neither has the loader"


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
        self._token_starts: list[int] | None = None  # once the token shards are open
        self.batches = 0  # batches built
        self.crossing = 0  # windows assembled from pieces of two or more shards
        self._running: Generator[Any, None, None] | None = None  # what close() ends

    @property
    def _starts(self) -> list[int]:
        # read on first use: a first pass still under way has no token shards yet
        if self._token_starts is None:
            self._token_starts = self.dataset.layout.token_starts.tolist()  # bisect: a few
        return self._token_starts

    def streaming(self) -> bool:
        """Whether an iteration started now streams a first pass (:func:`streams_first_pass`)."""
        return streams_first_pass(self.dataset)

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

    def _runs(self, ks: list[int], n: int) -> list[tuple[int, int, int, int]]:
        """The batch's windows as runs ``(i, j, s, lo)``: windows ``ks[i:j]`` follow
        each other inside shard ``s`` (``n`` tokens each), the first at ``lo`` in it;
        ``s`` -1 for a window that runs into the next shard (``j == i + 1``)."""
        starts, L = self._starts, self.dataset.seq_len
        runs = []
        b = len(ks)
        i = 0
        while i < b:
            a = ks[i] * L
            s = bisect.bisect_right(starts, a) - 1
            end = starts[s + 1]
            if a + n > end:
                runs.append((i, i + 1, -1, 0))
                i += 1
                continue
            # a run of consecutive windows inside shard s is one slice (unshuffled order)
            j = i + 1
            while j < b and ks[j] == ks[j - 1] + 1 and ks[j] * L + n <= end:
                j += 1
            runs.append((i, j, s, a - starts[s]))
            i = j
        return runs

    def build(self, windows: np.ndarray | list[int]) -> dict[str, Any]:
        """The batch of windows ``windows`` (global window indices, in order)."""
        ds = self.dataset
        source, L = ds.source, ds.seq_len
        ks = windows.tolist() if isinstance(windows, np.ndarray) else [int(k) for k in windows]
        if ds.labels == "hf":
            return self._build_hf(ks)
        b = len(ks)
        out = self._empty((2, b, L))
        ids, labels = out[0], out[1]
        itemsize = source.dtype.itemsize
        runs = self._runs(ks, L + 1)
        flags = np.empty((b, L + 1), dtype=np.uint8) if source.has_mask else None
        buf = np.empty(L + 1, dtype=np.int64)
        for i, j, s, lo in runs:
            if s < 0:  # runs into the next shard: assembled from its pieces
                at = 0
                pieces = ds.layout.pieces(ks[i])
                for sh, plo, phi in pieces:
                    source.tokens(sh, plo, phi, buf[at : at + phi - plo])  # counts it
                    at += phi - plo
                ids[i] = buf[:-1]
                labels[i] = buf[1:]
                if flags is not None:
                    flags[i] = ds.window_flags(pieces, L + 1)
                self.crossing += 1
                continue
            view, tier = source.token_view(s)
            r = j - i
            ids[i:j] = view[lo : lo + r * L].reshape(r, L)
            labels[i:j] = view[lo + 1 : lo + 1 + r * L].reshape(r, L)
            # as TokenDataset.window counts: the tokens, and the flags of a chat dataset
            served = r * (L + 1) * (itemsize + (flags is not None))
            source.count_served(tier, served)
            if flags is not None:
                shard_flags = source.shard_views(s)[2]
                assert shard_flags is not None
                block = shard_flags[lo : lo + r * L + 1]
                # window q's L + 1 flags start at q * L (neighbours share one)
                flags[i:j] = np.lib.stride_tricks.sliding_window_view(block, L + 1)[::L]
        if flags is not None:  # chat data: -100 where the shifted token is not trained
            np.putmask(labels, (flags[:, 1:] & TRAIN) == 0, -100)
        batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if ds.position_ids or ds.cu_seqlens:
            self._positions(self._starts_of(ks, runs), batch)
        self.batches += 1
        return batch

    def _build_hf(self, ks: list[int]) -> dict[str, Any]:
        # labels="hf": unshifted labels, attention_mask (and position_ids, cu_seqlens),
        # built for the whole batch at once from its runs' slices and document starts
        ds = self.dataset
        source, L, b = ds.source, ds.seq_len, len(ks)
        out = self._empty((3, b, L))
        ids, labels, attention = out[0], out[1], out[2]
        per_window = L * source.dtype.itemsize + (L if source.has_mask else 0)
        runs = self._runs(ks, L)
        flags = np.empty((b, L), dtype=np.uint8) if source.has_mask else None
        for i, j, s, lo in runs:
            if s < 0:  # runs into the next shard: assembled from its pieces
                pieces = ds.layout.pieces(ks[i])
                at = 0
                for sh, plo, phi in pieces:
                    source.tokens(sh, plo, phi, ids[i, at : at + phi - plo])  # counts it
                    at += phi - plo
                window_flags = ds.window_flags(pieces, L)  # counts them, as window() does
                if flags is not None:
                    flags[i] = window_flags
                self.crossing += 1
                continue
            tokens, _, shard_flags, tier = source.shard_views(s)
            r = j - i
            ids[i:j] = tokens[lo : lo + r * L].reshape(r, L)
            if flags is not None:
                assert shard_flags is not None
                flags[i:j] = shard_flags[lo : lo + r * L].reshape(r, L)
            source.count_served(tier, per_window * r)  # as TokenDataset.window counts
        first = self._starts_of(ks, runs)  # where a document (or the window) starts
        # labels: the token where trained and not a document's first, else -100;
        # attention_mask 0 on padding (fastload.text.tokens.hf_labels, batched)
        np.copyto(labels, ids)
        if flags is None:
            np.putmask(labels, first, -100)
            attention.fill(1)
        else:
            np.putmask(labels, first | ((flags & TRAIN) == 0), -100)
            np.copyto(attention, (flags & PAD) == 0)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy(attention),
        }
        if ds.position_ids or ds.cu_seqlens:
            self._positions(first, batch)
        self.batches += 1
        return batch

    def build_span(self, reader: Any, windows: range) -> dict[str, Any]:
        """The batch of consecutive windows ``windows`` read from a first pass's pieces
        (``reader``: a :class:`~fastload.text.parquet_stream.PieceReader` that loaded
        them), equal to :meth:`build` of the same windows once the token shards exist
        (parquet data has no per-token flags)."""
        ds = self.dataset
        L, b, hf = ds.seq_len, len(windows), ds.labels == "hf"
        a = windows.start * L
        out = self._empty((3 if hf else 2, b, L))
        ids, labels = out[0], out[1]
        if hf:
            docs = reader.span(a, a + b * L, ids.reshape(-1))
        else:  # window i's labels are its tokens shifted by one: one span of b*L + 1
            buf = np.empty(b * L + 1, dtype=np.int64)
            docs = reader.span(a, a + b * L + 1, buf)
            ids[:] = buf[:-1].reshape(b, L)
            labels[:] = buf[1:].reshape(b, L)
        first = np.zeros((b, L), dtype=bool)  # as _starts_of marks them
        first[:, 0] = True
        first.reshape(-1)[docs[docs < a + b * L] - a] = True
        if hf:  # as _build_hf without flags
            np.copyto(labels, ids)
            np.putmask(labels, first, -100)
            out[2].fill(1)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
        }
        if hf:
            batch["attention_mask"] = torch.from_numpy(out[2])
        if ds.position_ids or ds.cu_seqlens:
            self._positions(first, batch)
        self.batches += 1
        return batch

    def _starts_of(self, ks: list[int], runs: list[tuple[int, int, int, int]]) -> np.ndarray:
        """``bool[b, seq_len]``: True where a position restarts at 0 (the window's first
        token and each document start in it), as :meth:`TokenDataset.window` makes
        ``position_ids``."""
        ds = self.dataset
        L = ds.seq_len
        first = np.zeros((len(ks), L), dtype=bool)
        first[:, 0] = True
        for i, j, s, lo in runs:
            if s < 0:
                first[i] = ds._positions(ks[i], ds.layout.pieces(ks[i])) == 0
                continue
            docs = ds.source.shard_views(s)[1]
            hi = lo + (j - i) * L
            inside = docs[np.searchsorted(docs, lo) : np.searchsorted(docs, hi)]
            first[i:j].reshape(-1)[inside - lo] = True
        return first

    def _positions(self, first: np.ndarray, batch: dict[str, Any]) -> None:
        # position_ids and cu_seqlens as TokenDataset.window and collate_packed make
        # them: over the flattened batch (every row restarts at its first token), each
        # token's distance to the last restart
        ds = self.dataset
        b, L = first.shape
        restarts = np.flatnonzero(first)
        bounds = np.append(restarts, b * L)
        if ds.position_ids:
            pos = self._empty((b, L))
            flat = np.repeat(restarts, np.diff(bounds))
            np.subtract(np.arange(b * L, dtype=np.int64), flat, out=pos.reshape(-1))
            batch["position_ids"] = torch.from_numpy(pos)
        if ds.cu_seqlens:
            cu = bounds.astype(np.int32)
            batch["cu_seqlens"] = torch.from_numpy(cu)
            batch["max_seqlen"] = int(np.diff(cu).max())

    # --------------------------------------------------------------- iterate
    def iterate(self, batch_size: int, drop_last: bool) -> Iterator[Any]:
        """This rank's remaining batches of the epoch the dataset is set to (planned
        now, so a later ``configure`` of the dataset does not move them), each built
        when asked for; while :meth:`streaming`, from the first pass's pieces first."""
        ds = self.dataset
        if self.streaming():
            self._running = self._streamed(cast(Any, ds).stream_steps())
            return self._running
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

    def _streamed(self, steps: Iterator[Any]) -> Generator[dict[str, Any], None, None]:
        # (windows, reader): a full step from the pieces; (windows, None): the finished
        # plan's batch from the token shards (local files: nothing to prefetch)
        for windows, reader in steps:
            yield self.build(windows) if reader is None else self.build_span(reader, windows)

    def close(self) -> None:
        """End the running iteration (its prefetch threads stop)."""
        running, self._running = self._running, None
        if running is not None:
            running.close()
