"""``TokenDataset``: fixed-length windows of a tokenized dataset, through the cache.

The dataset is the concatenated token stream of every shard written by
:func:`fastload.convert.text` (manifest ``kind: "tokens"``). Window ``k`` covers
tokens ``[k*L, (k+1)*L]`` (``L + 1`` tokens, so ``labels`` is ``input_ids`` shifted by
one); the trailing partial window is dropped. A window is copied out of the mapped
shard(s) with numpy slicing, never token by token.

For sampling, each window belongs to the shard its first token is in, so the
shard-windowed shuffle, the node/rank/worker split and the resume arithmetic of
:mod:`fastload.sampling` apply to windows exactly as they do to image samples.
With :class:`fastload.DataLoader` it resumes exactly (and onto other world sizes
with the same global batch) through :class:`fastload.loader.dataloader.ResumableIterable`.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload._args import changing_default, keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.planned import PlannedIterable
from fastload.datasets.source import ShardSource
from fastload.errors import ConfigError, ShardFormatError
from fastload.sampling import World, rank_samples
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.shards.manifest import Manifest
from fastload.text.packing import PAD, TRAIN

__all__ = [
    "LABEL_MODES",
    "TokenDataset",
    "TokenLayout",
    "TokenSource",
    "collate_packed",
    "hf_labels",
    "shifted_labels",
]


class TokenLayout:
    """Where the windows of length ``seq_len`` lie in a stream made of shards of
    ``shard_tokens`` tokens. Pure arithmetic, no I/O.

    Window ``k`` starts at token ``k*seq_len`` and spans ``seq_len + extra`` tokens
    (``extra=1``: the token after the window, for labels shifted by one; ``0`` for
    unshifted labels). ``num_windows`` windows; ``shard_windows[s]`` of them start in
    shard ``s``; :meth:`pieces` says which shard ranges make up a window.
    """

    def __init__(self, shard_tokens: Sequence[int], seq_len: int, extra: int = 1) -> None:
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise ConfigError(f"seq_len must be a positive int, got {seq_len!r}")
        self.seq_len = seq_len
        self.extra = extra
        self.token_starts = np.zeros(len(shard_tokens) + 1, dtype=np.int64)
        np.cumsum(np.asarray(shard_tokens, dtype=np.int64), out=self.token_starts[1:])
        total = int(self.token_starts[-1])
        self.num_tokens = total
        self.num_windows = max(0, (total - extra) // seq_len)
        # window k starts in the shard holding token k*L: count them per shard
        first = -(-self.token_starts // seq_len)  # first window starting at or after each start
        first = np.minimum(first, self.num_windows)
        self.shard_windows = np.diff(first).astype(np.int64)
        self.window_starts = first  # global index of each shard's first window (+ total)
        self._starts_list = self.token_starts.tolist()  # bisect beats numpy for one lookup

    def pieces(self, k: int) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` token ranges within shards that, concatenated, are
        window ``k``'s ``seq_len + extra`` tokens."""
        a = k * self.seq_len
        b = a + self.seq_len + self.extra
        starts = self._starts_list
        s = bisect.bisect_right(starts, a) - 1
        out = []
        while a < b:
            base = starts[s]
            stop = min(b, starts[s + 1])
            if stop > a:
                out.append((s, a - base, stop - base))
            a = max(a, stop)
            s += 1
        return out


class TokenSource(ShardSource):
    """A :class:`ShardSource` over token shards: each shard's ``tokens`` and ``docs``
    arrays as numpy views of the mapped shard, and bytes served counted.

    Arguments as for :class:`~fastload.datasets.source.ShardSource` (all but ``url``
    by keyword). Raises :class:`ConfigError` for a dataset that is not made of token
    shards, :class:`ShardFormatError` for a malformed token manifest.
    """

    dtype: np.dtype[Any]  # the tokens' storage type, little-endian
    shard_tokens: list[int]
    eos_id: int
    has_mask: bool  # the shards hold per-token flags (chat data: fastload.text.packing)
    block_len: int | None  # chat data packed into blocks of this many tokens

    def _check_manifest(self) -> None:
        """Refuse a dataset that is not made of token shards; read the token facts."""
        m = self.manifest
        if m.kind != "tokens":
            raise ConfigError(
                f"{self.url} holds {m.kind} shards, not tokens; write token shards with "
                "fastload.convert.text (or read this dataset with StreamingDataset)"
            )
        meta = m.source
        try:
            self.dtype = np.dtype(str(meta["dtype"])).newbyteorder("<")
            shard_tokens = [int(t) for t in meta["shard_tokens"]]
            self.eos_id = int(meta.get("eos_id", -1))
            self.has_mask = bool(meta.get("mask", False))
            block = meta.get("block_len")
            self.block_len = None if block is None else int(block)
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardFormatError(f"token manifest lacks or garbles {exc}", self.url) from None
        if len(shard_tokens) != len(m.shards) or self.dtype.kind != "u":
            raise ShardFormatError(
                "token manifest: shard_tokens does not match the shards, or dtype is not unsigned",
                self.url,
            )
        self.shard_tokens = shard_tokens
        self._spans: dict[int, tuple[tuple[int, int], ...]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(dtype=self.dtype, shard_tokens=self.shard_tokens, eos_id=self.eos_id,
                     has_mask=self.has_mask, block_len=self.block_len)  # fmt: skip
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._spans = {}

    def _spans_of(self, s: int) -> tuple[tuple[int, int], ...]:
        """(offset, size) of shard ``s``'s tokens, docs (and mask) members."""
        spans = self._spans.get(s)
        if spans is None:
            entry = self.index(s).sample(0)
            name = f"{self.url}/{self.manifest.shards[s].name}"
            members = ("tokens", "docs", "mask") if self.has_mask else ("tokens", "docs")
            if any(m not in entry for m in members):
                raise ShardFormatError(
                    f"token shard lacks one of its members {', '.join(members)}", name
                )
            spans = tuple(entry[m] for m in members)
            if spans[0][1] != self.shard_tokens[s] * self.dtype.itemsize or (
                self.has_mask and spans[2][1] != self.shard_tokens[s]
            ):
                raise ShardFormatError(
                    f"tokens (or mask) member is {spans[0][1]} bytes; the manifest says "
                    f"{self.shard_tokens[s]} {self.dtype.name} tokens",
                    name,
                )
            self._spans[s] = spans
        return spans

    def flags(self, s: int, start: int, stop: int, out: np.ndarray) -> None:
        """Copy the per-token flags ``[start, stop)`` of shard ``s`` into ``out``
        (:data:`fastload.text.packing.TRAIN` for all in a dataset without a mask)."""
        if not self.has_mask:
            out[...] = TRAIN
            return
        offset = self._spans_of(s)[2][0]
        cached = self.shard(s)
        out[...] = np.frombuffer(cached.data, np.uint8, count=stop - start, offset=offset + start)
        self._served["ram" if cached.path is None else "disk"] += stop - start

    def tokens(self, s: int, start: int, stop: int, out: np.ndarray) -> None:
        """Copy tokens ``[start, stop)`` of shard ``s`` into ``out`` (converting dtype)."""
        offset = self._spans_of(s)[0][0]
        cached = self.shard(s)
        view = np.frombuffer(
            cached.data, self.dtype, count=stop - start, offset=offset + start * self.dtype.itemsize
        )
        out[...] = view
        del view
        self._served["ram" if cached.path is None else "disk"] += (
            stop - start
        ) * self.dtype.itemsize

    def _reset(self) -> None:
        super()._reset()
        # shard -> (its open shard, its views and tier) while it stays open here
        self._views: dict[int, tuple[Any, Any]] = {}

    def token_view(self, s: int) -> tuple[np.ndarray, str]:
        """Shard ``s``'s tokens as a numpy view of its mapping and the tier serving it
        (bytes read from it are the caller's to count). The view is kept while the
        shard stays open in this process's LRU (a hit costs a dict lookup and marks the
        shard used); one whose shard was closed is dropped at the next miss, so it
        keeps no closed mapping alive for long."""
        views = self.shard_views(s)
        return views[0], views[3]

    def shard_views(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str]:
        """Shard ``s``'s tokens, document offsets and flags (None without a mask) as
        numpy views of its mapping, and the tier serving it; kept as
        :meth:`token_view` keeps its view."""
        hit = self._views.get(s)
        if hit is not None:
            with self._lock:
                if self._open.get(s) is hit[0]:
                    self._open.move_to_end(s)
                    return hit[1]
        spans = self._spans_of(s)
        cached = self.shard(s)
        n = self.shard_tokens[s]
        tokens = np.frombuffer(cached.data, self.dtype, count=n, offset=spans[0][0])
        docs = np.frombuffer(cached.data, "<i8", count=spans[1][1] // 8, offset=spans[1][0])
        flags = None
        if self.has_mask:
            flags = np.frombuffer(cached.data, np.uint8, count=n, offset=spans[2][0])
        result = (tokens, docs, flags, "ram" if cached.path is None else "disk")
        with self._lock:
            views = {k: v for k, v in self._views.items() if self._open.get(k) is v[0]}
            views[s] = (cached, result)
            self._views = views
        return result

    def close(self) -> None:
        """Drop the kept token views, then close as :meth:`ShardSource.close`."""
        self._views = {}
        super().close()

    def docs(self, s: int) -> np.ndarray:
        """Document offsets within shard ``s`` (int64, 0 first, the token count last): a
        view of the mapping, to be dropped after use."""
        offset, size = self._spans_of(s)[1]
        cached = self.shard(s)
        return np.frombuffer(cached.data, "<i8", count=size // 8, offset=offset)


def collate_packed(batch: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, Any]:
    """Collate windows into a batch: fixed-length fields stacked to ``[B, L]``;
    ``cu_seqlens`` of the flattened ``B*L`` batch (int32, as varlen attention kernels
    take them), with ``max_seqlen`` (a Python int, as flash-attn's ``max_seqlen_q``)."""
    out: dict[str, Any] = {}
    for key in batch[0]:
        if key != "cu_seqlens":
            out[key] = torch.stack([item[key] for item in batch])
    if "cu_seqlens" in batch[0]:
        parts, base = [torch.zeros(1, dtype=torch.int32)], 0
        for item in batch:
            cu = item["cu_seqlens"]
            parts.append(cu[1:] + base)
            base += int(cu[-1])
        cu_all = torch.cat(parts)
        out["cu_seqlens"] = cu_all
        out["max_seqlen"] = int((cu_all[1:] - cu_all[:-1]).max())
    return out


#: What ``TokenDataset(labels=...)`` accepts: today's shifted labels, or Hugging Face's.
LABEL_MODES = ("shifted", "hf")


def hf_labels(ids: np.ndarray, flags: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unshifted ``labels`` and ``attention_mask`` of a window (see
    :class:`TokenDataset`'s ``labels="hf"``): ``ids`` where trained and not a
    document's first token, else -100; ``attention_mask`` 0 on padding."""
    labels = np.where(((flags & TRAIN) != 0) & (pos != 0), ids, -100)
    attention = ((flags & PAD) == 0).astype(np.int64)
    return labels, attention


def shifted_labels(buf: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """``buf[1:]`` with -100 where that token is not trained (today's labels of a
    dataset with a mask)."""
    return np.where((flags[1:] & TRAIN) != 0, buf[1:], -100)


#: Why ``shuffle`` of the token datasets defaults to True from the next release.
SHUFFLE_WHY = "one default for every iterable dataset: StreamingDataset's, a training order"


class TokenDataset(PlannedIterable):
    """Windows of ``seq_len`` tokens of the token dataset at ``url``.

    Item ``k``: ``{"input_ids": int64[seq_len], "labels": int64[seq_len]}`` (tokens
    ``k*L .. k*L+L-1`` and the same shifted by one; -100 where the shifted token is
    not trained, in a dataset of chat examples), plus ``"position_ids"`` (int64,
    restarting at 0 at each document start and at the window start) with
    ``position_ids=True`` and ``"cu_seqlens"`` (int32 document boundaries within the
    window, ``0`` first and ``seq_len`` last) with ``cu_seqlens=True``; batch those
    with :func:`collate_packed`.

    ``labels="hf"``: the Hugging Face convention instead. ``labels`` are not shifted
    (the model shifts them): ``input_ids`` with -100 at every token not trained (a
    chat dataset's prompts and padding) and at the first token of each document or
    example (no token is trained to follow the previous example, as
    ``DataCollatorWithFlattening`` does); ``attention_mask`` (int64, 0 on padding) is
    added. Windows are then ``seq_len`` tokens with no overlap, and over a chat
    dataset packed into blocks (``ChatConfig.seq_len``) ``seq_len`` must be the
    block length, so that every item is one block. Every item is ``seq_len`` long, so
    ``transformers``' default collator stacks them.

    Map-style: ``ds[k]`` for ``k < ds.num_windows``. Iterable: this rank's and
    DataLoader worker's share of the epoch, shuffled by window within groups of
    ``window_shards`` shards when ``shuffle``; ``len(ds)`` is then the windows this
    rank yields per epoch (``num_windows`` in a single process). ``world`` defaults
    to :meth:`World.detect`. Cache arguments as for :class:`~fastload.StreamingDataset`;
    ``source``, an open :class:`TokenSource`, replaces them (giving both is a
    ``TypeError``). Everything but ``url`` is passed by keyword.

    Raises :class:`ConfigError` for a bad ``seq_len`` or a dataset that is not made of
    token shards, :class:`ShardFormatError` for a malformed one.
    """

    _state_kind = "fastload.tokens"
    _state_label = "TokenDataset"
    # drop_last=False: the epoch's last global step is short and no window repeats;
    # the last ranks may then take fewer windows (see docs/howto-lora.md for DDP)
    _pad = "none"

    @keyword_only("seq_len", "cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
        *,
        seq_len: int,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        manifest: Manifest | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        source: TokenSource | None = None,
        labels: str = "shifted",
    ) -> None:
        super().__init__()
        if shuffle is None:
            shuffle = changing_default(
                "TokenDataset", "shuffle", False, True, SHUFFLE_WHY, stacklevel=4
            )
        if source is not None:
            given = {
                "cache_dir": cache_dir,
                "cache_limit": cache_limit,
                "ram_limit": ram_limit,
                "storage_options": storage_options,
                "cache_config": cache_config,
                "fetch": fetch,
                "manifest": manifest,
            }
            ignored = [name for name, value in given.items() if value is not None]
            if ignored:
                raise TypeError(
                    f"TokenDataset() got {', '.join(ignored)} beside source=, which "
                    "replaces them: configure the TokenSource instead"
                )
        self._init_plan(
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            window_shards=window_shards,
            prefetch_shards=prefetch_shards,
            world=world,
        )
        self.source: TokenSource = source or TokenSource(
            url,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            max_open_shards=max(3, window_shards + prefetch_shards + 1),
            manifest=manifest,
            cache_config=cache_config,
        )
        if labels not in LABEL_MODES:
            raise ConfigError(f"TokenDataset: labels must be one of {LABEL_MODES}, got {labels!r}")
        block = self.source.block_len
        if labels == "hf" and block is not None and seq_len != block:
            raise ConfigError(
                f"{url} holds chat examples packed into blocks of {block} tokens: read it "
                f"with seq_len={block} (got {seq_len}), or convert it again with "
                f"ChatConfig(seq_len={seq_len})"
            )
        self.labels = labels
        self.layout = TokenLayout(self.source.shard_tokens, seq_len, 0 if labels == "hf" else 1)
        if self.layout.num_windows == 0:
            n, extra = self.layout.num_tokens, self.layout.extra
            raise ConfigError(
                f"{url}: seq_len={seq_len} is longer than the corpus ({n} tokens): not one "
                f"window of {seq_len + extra} tokens; use seq_len <= {max(0, n - extra)}"
            )
        self.seq_len = seq_len
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens

    # ---------------------------------------------------------------- windows
    @property
    def num_windows(self) -> int:
        """Windows in the whole dataset (the map-style length)."""
        return self.layout.num_windows

    @property
    def num_tokens(self) -> int:
        """Tokens in the whole dataset."""
        return self.layout.num_tokens

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        n = self.num_windows
        k = int(k)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"window {k} out of range for {n} windows of {self.source.url}")
        return self.window(k)

    def window(self, k: int) -> dict[str, torch.Tensor]:
        """Window ``k`` as the item dict (no range check beyond the layout's)."""
        L = self.seq_len
        hf = self.labels == "hf"
        buf = np.empty(L + self.layout.extra, dtype=np.int64)
        pieces = self.layout.pieces(k)
        at = 0
        for s, lo, hi in pieces:
            self.source.tokens(s, lo, hi, buf[at : at + hi - lo])
            at += hi - lo
        pos = self._positions(k, pieces) if hf or self.position_ids or self.cu_seqlens else None
        if hf:
            assert pos is not None
            flags = self.window_flags(pieces, L)
            labels, attention = hf_labels(buf, flags, pos)
            item = {
                "input_ids": torch.from_numpy(buf),
                "labels": torch.from_numpy(labels),
                "attention_mask": torch.from_numpy(attention),
            }
        else:
            t = torch.from_numpy(buf)
            item = {"input_ids": t[:-1], "labels": t[1:]}
            if self.source.has_mask:
                flags = self.window_flags(pieces, L + 1)
                item["labels"] = torch.from_numpy(shifted_labels(buf, flags))
        if pos is not None and (self.position_ids or self.cu_seqlens):
            if self.position_ids:
                item["position_ids"] = torch.from_numpy(pos)
            if self.cu_seqlens:
                cu = np.append(np.flatnonzero(pos == 0), L).astype(np.int32)
                item["cu_seqlens"] = torch.from_numpy(cu)
        return item

    def window_flags(self, pieces: list[tuple[int, int, int]], n: int) -> np.ndarray:
        """The per-token flags of a window's ``pieces`` (``n`` tokens)."""
        flags = np.empty(n, dtype=np.uint8)
        at = 0
        for s, lo, hi in pieces:
            self.source.flags(s, lo, hi, flags[at : at + hi - lo])
            at += hi - lo
        return flags

    def _positions(self, k: int, pieces: list[tuple[int, int, int]]) -> np.ndarray:
        L = self.seq_len
        pos = np.empty(L, dtype=np.int64)
        at = 0
        for s, lo, hi in pieces:
            hi = min(hi, lo + L - at)  # the label-only last token has no position
            if hi <= lo:
                break
            docs = self.source.docs(s)
            t = np.arange(lo, hi, dtype=np.int64)
            start = docs[np.searchsorted(docs, t, side="right") - 1]
            # a document that began before the window restarts at the window's start
            pos[at : at + hi - lo] = t - np.maximum(start, lo if at == 0 else 0)
            at += hi - lo
        return pos

    # ------------------------------------------------------------------- plan
    def unit_counts(self) -> np.ndarray:
        """Windows per shard (a window belongs to the shard its first token is in)."""
        return self.layout.shard_windows

    @property
    def num_units(self) -> int:
        """Windows in the whole dataset."""
        return self.layout.num_windows

    def _state_extra(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "labels": self.labels}

    def __len__(self) -> int:
        """Windows this rank yields in a whole epoch (all workers together): with
        ``drop_last=False`` the last ranks may yield fewer (no window is repeated)."""
        n = self.num_units
        if not n:
            return 0
        world = self._world()
        st = self._started(world)
        return rank_samples(
            n,
            world.world_size,
            self.batch_size,
            canonical_nodes=st.canonical_nodes or 1,
            drop_last=self.drop_last,
            pad=self._pad,
            slot=world.slot,
        )

    # -------------------------------------------------------------- iterating
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _, k in self.plan_units():
            yield self.window(k)

    def __repr__(self) -> str:
        return (
            f"TokenDataset({self.source.url!r}, seq_len={self.seq_len}, labels={self.labels!r}, "
            f"windows={self.num_windows}, tokens={self.num_tokens}, shuffle={self.shuffle}, "
            f"seed={self.seed}, epoch={self.epoch})"
        )
