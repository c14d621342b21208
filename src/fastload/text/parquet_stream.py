"""Windows of a first pass still under way: read from the published token pieces.

:class:`~fastload.text.parquet_build.TokenBuild` publishes each piece of row groups
(``<i>.npz``: its tokens and document lengths) as soon as it is tokenized, pieces
claimed in file and row order, and cuts the token shards only when every piece
exists. The token stream of the finished dataset is the pieces' tokens end to end,
so window ``k`` (tokens ``[k*L, k*L + L + 1)``, or ``[k*L, k*L + L)`` with
``labels="hf"``) is known once the pieces up to the one holding its last token are
published, whatever the shards will be. A window crossing a piece boundary waits
for the next piece.

:class:`PieceReader` follows the published prefix of pieces (loading each once,
dropping those behind the reader): :meth:`PieceReader.span` reads any run of
tokens (windows across pieces included) with the document starts in it, and
:meth:`PieceReader.item` builds a window's item, the same item
:class:`~fastload.TokenDataset` would build from the shards (the loader builds whole
batches from spans: :mod:`fastload.loader.token_batches`). :func:`step_windows` is
the order arithmetic: the windows of one global step of the unshuffled, one-node
plan (:mod:`fastload.sampling.plan`), which needs no total count for any step but
the epoch's last; :func:`full_steps` walks those steps as their pieces arrive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from fastload.text.packing import TRAIN
from fastload.text.tokens import hf_labels

__all__ = ["PieceReader", "full_steps", "step_windows"]


def step_windows(consumed: int, step: int, global_batch: int, slot: int, batch: int) -> range:
    """Global window indices rank ``slot`` takes of full global step ``step`` in the
    unshuffled order with one canonical node, ``consumed`` windows already consumed:
    its run ``[slot*batch, (slot+1)*batch)`` of positions ``consumed + step*G ..``
    (as :func:`fastload.sampling.plan_rank` gives for a full step)."""
    first = consumed + step * global_batch + slot * batch
    return range(first, first + batch)


def full_steps(
    reader: PieceReader,
    running: Callable[[], bool],
    *,
    consumed: int,
    steps: Iterable[int],
    global_batch: int,
    slot: int,
    batch: int,
) -> Iterator[range]:
    """:func:`step_windows` of each of ``steps`` (full global steps, in order), each
    yielded once ``reader`` has loaded every token of the step's last window (of any
    rank: only then is the step known to be full). Ends at the first step that cannot
    be served from the pieces: every piece loaded (the step is the epoch's short last
    one, or past the end), the pieces gone (the dataset was published), or
    ``running()`` false (the first pass ended, or the dataset was opened meanwhile);
    the rest of the epoch then comes from the finished plan."""
    L, extra = reader.seq_len, reader.extra
    for step in steps:
        need = (consumed + (step + 1) * global_batch) * L + extra  # the step's last window
        while not reader.load_until(need):
            if reader.vanished or reader.complete or not running():
                return
            time.sleep(0.005)
        yield step_windows(consumed, step, global_batch, slot, batch)


class PieceReader:
    """The published prefix of the pieces in ``pieces_dir`` (``count`` of them), as a
    token stream. ``load_until(t)`` loads pieces in order until the first ``t``
    tokens are known (False if the next piece is not there yet, or went away because
    the dataset was published meanwhile: ``vanished``, once ``manifest`` exists);
    :meth:`item` builds window ``k`` (``hf``: with ``labels="hf"``'s fields, windows of
    ``seq_len`` tokens with no overlap; else shifted labels, ``seq_len + 1`` tokens).
    ``itemsize``: bytes per stored token (``window_bytes``: a window's, as
    :class:`~fastload.TokenDataset` counts what it serves)."""

    def __init__(
        self,
        pieces_dir: Path,
        count: int,
        seq_len: int,
        manifest: Path,
        hf: bool = False,
        itemsize: int = 2,
    ) -> None:
        self.pieces_dir = pieces_dir
        self.manifest = manifest  # the finished dataset's: once it exists, pieces go
        self.count = count
        self.seq_len = seq_len
        self.hf = hf
        self.extra = 0 if hf else 1  # tokens a window reads beyond its seq_len
        self.window_bytes = (seq_len + self.extra) * itemsize
        self.next_piece = 0  # the first piece not loaded yet
        self.known = 0  # tokens of pieces 0 .. next_piece-1
        # loaded pieces still needed: (global start, tokens, global document starts)
        self._pieces: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.vanished = False  # a piece was removed: the dataset is published
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        """Every piece loaded (``known`` is the corpus's token count)."""
        return self.next_piece >= self.count

    def published(self) -> int:
        """Pieces on disk now (a progress count; pieces are deleted once the token
        shards are published)."""
        try:
            return sum(1 for p in self.pieces_dir.glob("*.npz"))
        except OSError:
            return 0

    def load_until(self, tokens: int) -> bool:
        """Load published pieces in order until ``tokens`` tokens are known."""
        with self._lock:
            while self.known < tokens and not self.complete:
                path = self.pieces_dir / f"{self.next_piece:06d}.npz"
                try:
                    with np.load(path) as z:
                        toks, lengths = z["tokens"], z["lengths"]
                except FileNotFoundError:
                    # not tokenized yet (the pieces' directory may not even exist yet),
                    # or removed after the shards were published
                    self.vanished = self.manifest.exists()
                    return False
                starts = self.known + np.concatenate(([0], np.cumsum(lengths)[:-1]))
                self._pieces.append((self.known, toks, starts.astype(np.int64)))
                self.known += int(toks.size)
                self.next_piece += 1
            return self.known >= tokens

    def span(self, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """Tokens ``[a, b)`` into ``out`` (int64, ``b - a`` of them; a new array if
        None), from the loaded pieces (:meth:`load_until` ``b`` first), across piece
        boundaries; returns the global starts of the documents that begin in
        ``[a, b)``. Pieces ending at or before ``a`` are dropped (spans are read in
        increasing order)."""
        while len(self._pieces) > 1 and self._pieces[1][0] <= a:
            self._pieces.pop(0)
        if out is None:
            out = np.empty(b - a, dtype=np.int64)
        starts: list[np.ndarray] = []
        for base, toks, docs in self._pieces:
            end = base + toks.size
            if base >= b:
                break
            lo, hi = max(a, base), min(b, end)
            if hi > lo:
                out[lo - a : hi - a] = toks[lo - base : hi - base]
                starts.append(docs[(docs >= lo) & (docs < hi)])
        return np.concatenate(starts) if starts else np.zeros(0, np.int64)

    def item(self, k: int, position_ids: bool, cu_seqlens: bool) -> dict[str, torch.Tensor]:
        """Window ``k`` as :meth:`fastload.TokenDataset.window` builds it (the labels
        of :attr:`hf`), from tokens already loaded (:meth:`load_until`)."""
        L = self.seq_len
        a = k * L
        buf = np.empty(L + self.extra, dtype=np.int64)
        starts = self.span(a, a + buf.size, buf)
        pos = None
        if self.hf or position_ids or cu_seqlens:
            # each token's distance to the last document start (or the window's start)
            restart = np.zeros(L, dtype=np.int64)
            inside = starts[starts < a + L] - a
            restart[inside] = inside
            pos = np.arange(L, dtype=np.int64) - np.maximum.accumulate(restart)
        if self.hf:
            assert pos is not None
            labels, attention = hf_labels(buf, np.full(L, TRAIN, dtype=np.uint8), pos)
            item = {"input_ids": torch.from_numpy(buf), "labels": torch.from_numpy(labels),
                    "attention_mask": torch.from_numpy(attention)}  # fmt: skip
        else:
            t = torch.from_numpy(buf)
            item = {"input_ids": t[:-1], "labels": t[1:]}
        if pos is not None:
            if position_ids:
                item["position_ids"] = torch.from_numpy(pos)
            if cu_seqlens:
                cu = np.append(np.flatnonzero(pos == 0), L).astype(np.int32)
                item["cu_seqlens"] = torch.from_numpy(cu)
        return item
