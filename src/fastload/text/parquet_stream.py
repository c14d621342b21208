"""Windows of a first pass still under way: read from the published token pieces.

:class:`~fastload.text.parquet_build.TokenBuild` publishes each piece of row groups
(``<i>.npz``: its tokens and document lengths) as soon as it is tokenized, pieces
claimed in file and row order, and cuts the token shards only when every piece
exists. The token stream of the finished dataset is the pieces' tokens end to end,
so window ``k`` (tokens ``[k*L, k*L + L + 1)``) is known once the pieces up to the
one holding its last token are published, whatever the shards will be. A window
crossing a piece boundary waits for the next piece.

:class:`PieceReader` follows the published prefix of pieces (loading each once,
dropping those behind the reader) and builds window items from it, the same items
:class:`~fastload.TokenDataset` would build from the shards. :func:`step_windows`
is the order arithmetic: the windows of one global step of the unshuffled,
one-node plan (:mod:`fastload.sampling.plan`), which needs no total count for any
step but the epoch's last.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["PieceReader", "step_windows"]


def step_windows(consumed: int, step: int, global_batch: int, slot: int, batch: int) -> range:
    """Global window indices rank ``slot`` takes of full global step ``step`` in the
    unshuffled order with one canonical node, ``consumed`` windows already consumed:
    its run ``[slot*batch, (slot+1)*batch)`` of positions ``consumed + step*G ..``
    (as :func:`fastload.sampling.plan_rank` gives for a full step)."""
    first = consumed + step * global_batch + slot * batch
    return range(first, first + batch)


class PieceReader:
    """The published prefix of the pieces in ``pieces_dir`` (``count`` of them), as a
    token stream. ``load_until(t)`` loads pieces in order until the first ``t``
    tokens are known (False if the next piece is not there yet, or went away because
    the dataset was published meanwhile: ``vanished``, once ``manifest`` exists);
    :meth:`item` builds window ``k``."""

    def __init__(self, pieces_dir: Path, count: int, seq_len: int, manifest: Path) -> None:
        self.pieces_dir = pieces_dir
        self.manifest = manifest  # the finished dataset's: once it exists, pieces go
        self.count = count
        self.seq_len = seq_len
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

    def _tokens(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[a, b)`` (int64) and the document starts at or before ``b``
        (global), from the loaded pieces; pieces ending at or before ``a`` are dropped
        (windows are read in increasing order)."""
        while len(self._pieces) > 1 and self._pieces[1][0] <= a:
            self._pieces.pop(0)
        out = np.empty(b - a, dtype=np.int64)
        starts: list[np.ndarray] = []
        for base, toks, docs in self._pieces:
            end = base + toks.size
            if base >= b:
                break
            starts.append(docs)
            lo, hi = max(a, base), min(b, end)
            if hi > lo:
                out[lo - a : hi - a] = toks[lo - base : hi - base]
        return out, np.concatenate(starts) if starts else np.zeros(1, np.int64)

    def item(self, k: int, position_ids: bool, cu_seqlens: bool) -> dict[str, torch.Tensor]:
        """Window ``k`` as :meth:`fastload.TokenDataset.window` builds it (shifted
        labels), from tokens already loaded (:meth:`load_until`)."""
        L = self.seq_len
        a = k * L
        buf, doc_starts = self._tokens(a, a + L + 1)
        t = torch.from_numpy(buf)
        item: dict[str, Any] = {"input_ids": t[:-1], "labels": t[1:]}
        if position_ids or cu_seqlens:
            at = np.arange(a, a + L, dtype=np.int64)
            start = doc_starts[np.searchsorted(doc_starts, at, side="right") - 1]
            pos = at - np.maximum(start, a)  # a document begun before restarts at the window
            if position_ids:
                item["position_ids"] = torch.from_numpy(pos)
            if cu_seqlens:
                cu = np.append(np.flatnonzero(pos == 0), L).astype(np.int32)
                item["cu_seqlens"] = torch.from_numpy(cu)
        return item
