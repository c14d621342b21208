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
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.resume import IterableResume
from fastload.datasets.source import ShardSource, SourceBacked
from fastload.errors import ConfigError, ShardFormatError
from fastload.sampling import SamplerState, World, epoch_steps, plan_from_state, worker_indices
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.sampling.plan import shard_of
from fastload.shards.manifest import Manifest

__all__ = ["TokenDataset", "TokenLayout", "TokenSource", "collate_packed"]


class TokenLayout:
    """Where the windows of length ``seq_len`` lie in a stream made of shards of
    ``shard_tokens`` tokens. Pure arithmetic, no I/O.

    ``num_windows`` windows; ``shard_windows[s]`` of them start in shard ``s``;
    :meth:`pieces` says which shard ranges make up a window.
    """

    def __init__(self, shard_tokens: Sequence[int], seq_len: int) -> None:
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise ConfigError(f"seq_len must be a positive int, got {seq_len!r}")
        self.seq_len = seq_len
        self.token_starts = np.zeros(len(shard_tokens) + 1, dtype=np.int64)
        np.cumsum(np.asarray(shard_tokens, dtype=np.int64), out=self.token_starts[1:])
        total = int(self.token_starts[-1])
        self.num_tokens = total
        self.num_windows = max(0, (total - 1) // seq_len)
        # window k starts in the shard holding token k*L: count them per shard
        first = -(-self.token_starts // seq_len)  # first window starting at or after each start
        first = np.minimum(first, self.num_windows)
        self.shard_windows = np.diff(first).astype(np.int64)
        self.window_starts = first  # global index of each shard's first window (+ total)
        self._starts_list = self.token_starts.tolist()  # bisect beats numpy for one lookup

    def pieces(self, k: int) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` token ranges within shards that, concatenated, are
        window ``k``'s ``seq_len + 1`` tokens."""
        a = k * self.seq_len
        b = a + self.seq_len + 1
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

    @keyword_only(
        "storage_options",
        "cache_dir",
        "cache_limit",
        "ram_limit",
        "fetch",
        "max_open_shards",
        "manifest",
        "cache_config",
    )
    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        fetch: FetchConfig | None = None,
        max_open_shards: int | None = None,
        manifest: Manifest | None = None,
        cache_config: CacheConfig | None = None,
    ) -> None:
        super().__init__(
            url,
            storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            max_open_shards=max_open_shards,
            manifest=manifest,
            cache_config=cache_config,
        )
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
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardFormatError(f"token manifest lacks or garbles {exc}", self.url) from None
        if len(shard_tokens) != len(m.shards) or self.dtype.kind != "u":
            raise ShardFormatError(
                "token manifest: shard_tokens does not match the shards, or dtype is not unsigned",
                self.url,
            )
        self.shard_tokens = shard_tokens
        self._spans: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(dtype=self.dtype, shard_tokens=self.shard_tokens, eos_id=self.eos_id)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._spans = {}

    def _spans_of(self, s: int) -> tuple[tuple[int, int], tuple[int, int]]:
        spans = self._spans.get(s)
        if spans is None:
            entry = self.index(s).sample(0)
            name = f"{self.url}/{self.manifest.shards[s].name}"
            if "tokens" not in entry or "docs" not in entry:
                raise ShardFormatError("token shard lacks its tokens or docs member", name)
            spans = (entry["tokens"], entry["docs"])
            if spans[0][1] != self.shard_tokens[s] * self.dtype.itemsize:
                raise ShardFormatError(
                    f"tokens member is {spans[0][1]} bytes; the manifest says "
                    f"{self.shard_tokens[s]} {self.dtype.name} tokens",
                    name,
                )
            self._spans[s] = spans
        return spans

    def tokens(self, s: int, start: int, stop: int, out: np.ndarray) -> None:
        """Copy tokens ``[start, stop)`` of shard ``s`` into ``out`` (converting dtype)."""
        (offset, _), _ = self._spans_of(s)
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
        # shard -> (its open shard, a view of its tokens, tier) while it stays open here
        self._views: dict[int, tuple[Any, np.ndarray, str]] = {}

    def token_view(self, s: int) -> tuple[np.ndarray, str]:
        """Shard ``s``'s tokens as a numpy view of its mapping and the tier serving it
        (bytes read from it are the caller's to count). The view is kept while the
        shard stays open in this process's LRU (a hit costs a dict lookup and marks the
        shard used); one whose shard was closed is dropped at the next miss, so it
        keeps no closed mapping alive for long."""
        hit = self._views.get(s)
        if hit is not None:
            with self._lock:
                if self._open.get(s) is hit[0]:
                    self._open.move_to_end(s)
                    return hit[1], hit[2]
        (offset, _), _ = self._spans_of(s)
        cached = self.shard(s)
        view = np.frombuffer(cached.data, self.dtype, count=self.shard_tokens[s], offset=offset)
        tier = "ram" if cached.path is None else "disk"
        with self._lock:
            views = {k: v for k, v in self._views.items() if self._open.get(k) is v[0]}
            views[s] = (cached, view, tier)
            self._views = views
        return view, tier

    def close(self) -> None:
        """Drop the kept token views, then close as :meth:`ShardSource.close`."""
        self._views = {}
        super().close()

    def docs(self, s: int) -> np.ndarray:
        """Document offsets within shard ``s`` (int64, 0 first, the token count last): a
        view of the mapping, to be dropped after use."""
        _, (offset, size) = self._spans_of(s)
        cached = self.shard(s)
        return np.frombuffer(cached.data, "<i8", count=size // 8, offset=offset)


def collate_packed(batch: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collate windows into a batch: fixed-length fields stacked to ``[B, L]``;
    ``cu_seqlens`` of the flattened ``B*L`` batch (int32, as varlen attention kernels
    take them), with ``max_seqlen``."""
    out: dict[str, torch.Tensor] = {}
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
        out["max_seqlen"] = torch.tensor(int((cu_all[1:] - cu_all[:-1]).max()), dtype=torch.int32)
    return out


class TokenDataset(IterableResume, SourceBacked, torch.utils.data.IterableDataset[Any]):
    """Windows of ``seq_len`` tokens of the token dataset at ``url``.

    Item ``k``: ``{"input_ids": int64[seq_len], "labels": int64[seq_len]}`` (tokens
    ``k*L .. k*L+L-1`` and the same shifted by one), plus ``"position_ids"`` (int64,
    restarting at 0 at each document start and at the window start) with
    ``position_ids=True`` and ``"cu_seqlens"`` (int32 document boundaries within the
    window, ``0`` first and ``seq_len`` last) with ``cu_seqlens=True``; batch those
    with :func:`collate_packed`.

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
        shuffle: bool = False,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        source: TokenSource | None = None,
    ) -> None:
        super().__init__()
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
        if prefetch_shards < 0:
            raise ConfigError(f"prefetch_shards must be >= 0, got {prefetch_shards}")
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
        self.layout = TokenLayout(self.source.shard_tokens, seq_len)
        self.seq_len = seq_len
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.window_shards = window_shards
        self.prefetch_shards = prefetch_shards
        self.world = world
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens
        self.batch_size = 1
        self._state = SamplerState(seed=seed)
        # this copy's iterator: windows yielded of its worker's share, and which worker
        self._yielded = self._skip = 0
        self._position: tuple[int, int] = (0, 1)
        self._saved_position: tuple[int, int] | None = None

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
        buf = np.empty(L + 1, dtype=np.int64)
        pieces = self.layout.pieces(k)
        at = 0
        for s, lo, hi in pieces:
            self.source.tokens(s, lo, hi, buf[at : at + hi - lo])
            at += hi - lo
        t = torch.from_numpy(buf)
        item = {"input_ids": t[:-1], "labels": t[1:]}
        if self.position_ids or self.cu_seqlens:
            pos = self._positions(k, pieces)
            if self.position_ids:
                item["position_ids"] = torch.from_numpy(pos)
            if self.cu_seqlens:
                cu = np.append(np.flatnonzero(pos == 0), L).astype(np.int32)
                item["cu_seqlens"] = torch.from_numpy(cu)
        return item

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
    @property
    def seed(self) -> int:
        """The shuffling seed."""
        return self._state.seed

    @property
    def epoch(self) -> int:
        """The epoch the next iteration plans."""
        return self._state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` next (from its start unless :meth:`configure` says otherwise)."""
        if epoch != self._state.epoch:
            # the layout is chosen afresh at the epoch's start (SamplerState.started)
            self._state = dataclasses.replace(self._state.next_epoch(), epoch=int(epoch))
            self._yielded = self._skip = 0

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None:
        """Set the loader's batch size and the global windows already consumed this epoch."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.drop_last = drop_last
        consumed = int(samples_consumed)
        # at the epoch's start the layout is the iterating world's; mid-epoch, the one
        # recorded (loaded) is kept, as StreamingDataset does
        layout = self._state.canonical_nodes if consumed else None
        self._state = dataclasses.replace(
            self._state, samples_consumed=consumed, canonical_nodes=layout
        )
        self._yielded = self._skip = 0

    def _world(self) -> World:
        if self.world is None:
            return World.detect()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return self.world.with_worker(info.id, info.num_workers)
        return self.world

    def _started(self, world: World) -> SamplerState:
        state = self._state
        if state.canonical_nodes is None:
            state = dataclasses.replace(state, canonical_nodes=world.num_nodes)
        return state.started(world, self.batch_size, self.num_windows)

    def loader_state(self) -> dict[str, Any]:
        """Seed and canonical layout, for the loader's ``state_dict``."""
        world = self._world()
        started = self._started(world) if self.num_windows else self._state
        return {
            "seed": started.seed,
            "epoch": started.epoch,
            "canonical_nodes": started.canonical_nodes or world.num_nodes,
            "num_samples": self.num_windows,
            "seq_len": self.seq_len,
            "shuffle": self.shuffle,
            "window_shards": self.window_shards,
        }

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`loader_state` saved; raises :class:`ConfigError` when the
        state belongs to another dataset or window length."""
        for name, mine in (
            ("num_samples", self.num_windows),
            ("seq_len", self.seq_len),
            ("shuffle", self.shuffle),
            ("window_shards", self.window_shards),
        ):
            if name in state and state[name] != mine:
                raise ConfigError(
                    f"loader state was saved with {name}={state[name]!r}; this TokenDataset "
                    f"({self.source.url}) has {name}={mine!r}"
                )
        # the epoch too: the loader's set_epoch(that epoch) then keeps the saved layout
        # (a new epoch would choose its own)
        self._state = dataclasses.replace(
            self._state,
            seed=int(state["seed"]),
            epoch=int(state.get("epoch", self._state.epoch)),
            canonical_nodes=state.get("canonical_nodes"),
        )

    def _resume_started(self) -> SamplerState:
        return self._started(self._world()) if self.num_windows else self._state

    def rank_plan(self, world: World | None = None) -> np.ndarray:
        """This rank's remaining window indices for the epoch, in loader order."""
        world = world or self._world()
        if not self.num_windows:
            return np.zeros(0, dtype=np.int64)
        return plan_from_state(
            self._started(world),
            self.layout.shard_windows,
            world,
            self.batch_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            window_shards=self.window_shards,
        )

    def __len__(self) -> int:
        """Windows this rank yields per epoch (all workers together) at the loader's
        batch size (1 until configured)."""
        if not self.num_windows:
            return 0
        world = self._world()
        st = self._started(world)
        steps = epoch_steps(
            self.num_windows,
            world.world_size * self.batch_size,
            canonical_nodes=st.canonical_nodes or 1,
            drop_last=self.drop_last,
        )
        return steps * self.batch_size

    # -------------------------------------------------------------- iterating
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        world = self._world()
        plan = self.rank_plan(world)
        skip = self._start_position((world.worker, world.num_workers))
        if not plan.size:
            return
        mine = worker_indices(plan, self.batch_size, world.num_workers, world.worker)
        shards = shard_of(mine, self.layout.shard_windows)
        _, first = np.unique(shards, return_index=True)
        first = np.sort(first)
        first_use = shards[first]
        at = {int(p): k for k, p in enumerate(first)}
        for pos in range(mine.size):
            k = at.get(pos)
            if k is not None and self.prefetch_shards and k + 1 < first_use.size:
                upcoming = first_use[k + 1 : k + 1 + self.prefetch_shards]
                self.source.prefetch([int(s) for s in upcoming])
            if pos < skip:
                continue  # yielded before the state was saved
            self._yielded = pos + 1
            yield self.window(int(mine[pos]))

    def __repr__(self) -> str:
        return (
            f"TokenDataset({self.source.url!r}, seq_len={self.seq_len}, "
            f"windows={self.num_windows}, tokens={self.num_tokens}, shuffle={self.shuffle}, "
            f"seed={self.seed}, epoch={self.epoch})"
        )
