"""``ParquetTokenDataset``: token windows of existing parquet files, tokenized once
per node.

The same windows as :class:`~fastload.TokenDataset` over the documents of
``text_field`` (file and row order, EOS after each), **tokenized once per node**:
the processes on the node that construct it share the row groups among them, each
tokenizing on every core with the download overlapped
(:mod:`fastload.text.parquet_build`), and one publishes the token shards at
``<cache_dir>/text/tokens/<key>/`` (a directory rename), keyed by each source's
canonical URL (local paths resolved), size and footer checksum, the tokenizer's
fingerprint, the field, EOS and dtype. Every later epoch, rank and job on the node
reads those tokens, and never the parquet files. Every argument is checked before
any file is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastload._args import changing_default
from fastload.cache.external import hold_tokens
from fastload.cache.shard_cache import CachedShard
from fastload.config import CacheConfig, parse_size
from fastload.errors import ConfigError, SourceDataError
from fastload.sampling import SamplerState, World, plan_from_state, worker_indices
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.storage import ObjectStore
from fastload.text.parquet_build import TokenBuild, plan_pieces
from fastload.text.parquet_files import (
    DEFAULT_PATTERN,
    ParquetFile,
    ParquetFileCache,
    scan_parquet,
)
from fastload.text.parquet_stream import PieceReader, full_steps
from fastload.text.tokens import LABEL_MODES, SHUFFLE_WHY, TokenDataset, TokenSource

__all__ = ["ParquetTokenDataset"]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_arguments(
    *,
    seq_len: Any,
    text_field: Any,
    seed: Any,
    world: Any,
    window_shards: Any,
    prefetch_shards: Any,
    threads: Any,
    shuffle: Any,
    stream: Any = False,
    labels: Any = "shifted",
) -> None:
    """The values TokenDataset would refuse only after the tokens exist."""
    if not _is_int(seq_len) or seq_len < 1:
        raise ConfigError(f"seq_len must be a positive int, got {seq_len!r}")
    if not isinstance(text_field, str) or not text_field:
        raise ConfigError(f"text_field must be a column name, got {text_field!r}")
    if not _is_int(seed):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    if world is not None and not isinstance(world, World):
        raise ConfigError(f"world must be a fastload.World or None, got {world!r}")
    if not _is_int(window_shards) or window_shards < 1:
        raise ConfigError(f"window_shards must be a positive int, got {window_shards!r}")
    if not _is_int(prefetch_shards) or prefetch_shards < 0:
        raise ConfigError(f"prefetch_shards must be >= 0, got {prefetch_shards!r}")
    if not _is_int(threads) or threads < 0:
        raise ConfigError(f"threads must be >= 0 (0: one per core), got {threads!r}")
    if shuffle is not None and not isinstance(shuffle, bool):
        raise ConfigError(f"shuffle must be True, False or None, got {shuffle!r}")
    if not isinstance(stream, bool):
        raise ConfigError(f"stream must be True or False, got {stream!r}")
    if labels not in LABEL_MODES:
        raise ConfigError(f"labels must be one of {LABEL_MODES}, got {labels!r}")


def token_dir(
    cache_dir: str | os.PathLike[str],
    files: Sequence[ParquetFile],
    fingerprint: str,
    text_field: str,
    eos: int,
    dtype: np.dtype[Any],
) -> Path:
    """Where the token shards of ``files`` live in the node cache at ``cache_dir``:
    ``<cache_dir>/text/tokens/<key>``, keyed by each file's canonical URL, size and
    footer checksum, the tokenizer's fingerprint, the field, EOS and dtype."""
    key_doc = {
        "files": [[f.canonical_url, f.size, f.footer_checksum] for f in files],
        "tokenizer": fingerprint,
        "field": text_field,
        "eos_id": eos,
        "dtype": np.dtype(dtype).name,
    }
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:40]
    return Path(os.path.abspath(os.fspath(cache_dir))) / "text" / "tokens" / key


@dataclass(frozen=True)
class _Done:
    pin: Any  # the cache's pin on the token directory (fastload.cache.external)
    published: bool  # this process published the dataset
    pieces: int  # pieces this process tokenized
    fetched: int  # bytes of parquet this process fetched


@dataclass(frozen=True)
class FirstPass:
    """Everything the first pass needs (picklable): :meth:`run` joins the node's
    build of the token shards (:class:`~fastload.text.parquet_build.TokenBuild`),
    under the cache's one cap, and returns once they are published."""

    files: Sequence[ParquetFile]
    storage_options: Mapping[str, Any] | None
    cache_dir: str
    token_dir: Path
    tokenizer: Any
    field: str
    eos: int
    dtype: np.dtype[Any]
    shard_size: int | str
    meta: dict[str, Any]
    threads: int
    progress: bool

    @property
    def pieces_dir(self) -> Path:
        """Where the pieces are published while the build runs."""
        return self.token_dir.parent / f".{self.token_dir.name}.pieces"

    def run(self) -> _Done:
        """Tokenize (or help tokenize, or find) the token shards; pin them."""
        result: dict[str, Any] = {"published": False, "pieces": 0, "fetched": 0}

        def tokenize() -> None:
            # every process that asks joins the first pass (fastload.text.parquet_build)
            config = CacheConfig(cache_dir=self.cache_dir)
            file_cache = ParquetFileCache(self.files, self.storage_options, config, None, 4)
            try:
                build = TokenBuild(self.files, file_cache, self.token_dir,
                                   tokenizer=self.tokenizer, field=self.field, eos_id=self.eos,
                                   dtype=self.dtype, shard_size=self.shard_size,
                                   meta=dict(self.meta), threads=self.threads,
                                   progress=self.progress)  # fmt: skip
                result["published"] = build.run()
                result["pieces"] = build.pieces_done
                result["fetched"] = file_cache.remote_bytes()
            finally:
                file_cache.close()

        # under the cache's one cap, pinned while the dataset lives (fastload.cache.external)
        size = sum(f.size for f in self.files)
        pin = hold_tokens(self.cache_dir, self.token_dir, size, self.dtype.itemsize, tokenize)
        return _Done(pin, result["published"], result["pieces"], result["fetched"])


class _Pending:
    """A first pass running in a thread of this process (``stream=True``)."""

    def __init__(self, first_pass: FirstPass) -> None:
        self.first_pass = first_pass
        self.count = len(plan_pieces(first_pass.files))
        self.done: _Done | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="fastload-first-pass", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.done = self.first_pass.run()
        except BaseException as exc:  # raised where the dataset next needs the tokens
            self.error = exc

    def running(self) -> bool:
        """Whether the first pass still runs in this process."""
        return self.thread.is_alive()

    def wait(self) -> _Done:
        """The finished first pass (run here when this is a copy in another process,
        e.g. unpickled in a worker); raises what it raised."""
        if self.thread.ident is not None and self.thread.is_alive():
            self.thread.join()
        if self.error is not None:
            raise self.error
        if self.done is None:
            self.done = self.first_pass.run()
        return self.done

    def __getstate__(self) -> dict[str, Any]:
        return {"first_pass": self.first_pass, "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a copy in another process has no thread: wait() joins the build there
        self.__dict__.update(state, done=None, error=None, thread=threading.Thread())


class _LocalTokenSource(TokenSource):
    """Token shards published in the node's cache directory: mapped in place (they
    were verified when written), not copied into the disk tier again."""

    def shard(self, shard: int) -> CachedShard:
        self._check_pid()
        with self._lock:
            cached = self._open.get(shard)
            if cached is not None:
                self._open.move_to_end(shard)
                return cached
        import mmap

        info = self.manifest.shards[shard]
        path = Path(self.url.removeprefix("file://")) / info.name
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cached = CachedShard(self.cache.key(self.dataset_id, info), memoryview(mapping), path,
                             None, mapping)  # fmt: skip
        with self._lock:
            self._open[shard] = cached
            while len(self._open) > self.max_open_shards:
                _, old = self._open.popitem(last=False)
                old.close()
        return cached

    def prefetch(self, shards: Sequence[int]) -> None:
        """Nothing to stage: the shards are local files."""


class ParquetTokenDataset(TokenDataset):
    """:class:`~fastload.TokenDataset` windows of ``seq_len`` tokens over the documents
    of existing parquet files, tokenized once per node.

    ``url``: a parquet file, directory, glob or prefix (or a list), files in name
    order; ``text_field`` is the text column, each document followed by ``eos_id``
    (default: the tokenizer's EOS token). ``tokenizer``: a ``tokenizer.json`` path or
    a ``tokenizers.Tokenizer``. Data files are those whose name matches ``pattern``
    (default ``*.parquet``). The processes on the node that construct it at once
    (local ranks) share the tokenizing, row groups split between them, each over
    ``threads`` encoding threads (0: one per core), into
    ``<cache_dir>/text/tokens/<key>/`` (``dtype``, ``shard_size`` and ``progress`` as
    for :func:`fastload.convert.text`); every later one maps those token shards in
    place (counted under the cache's cap, which may evict them when no dataset holds
    them; the remote parquet files pass through the node cache's disk tier).
    ``shuffle``, ``seed``, ``world``, ``drop_last``, ``window_shards``,
    ``prefetch_shards``, ``position_ids``, ``cu_seqlens``, ``labels`` (``"hf"``: the
    Hugging Face fields) and resume as for TokenDataset. Everything but ``url`` is
    passed by keyword.

    ``stream=True``: when the tokens are not on the node yet, the constructor returns
    at once, the first pass runs in a thread, and the first epoch unshuffled on one
    node serves each window as soon as the pieces of row groups holding it are
    tokenized (:mod:`fastload.text.parquet_stream`), in the order, rank/worker split
    and resume state of the finished dataset: iterating the dataset, and the batches
    of a :class:`fastload.DataLoader` over it (:meth:`stream_steps`; its ``len()``
    raises ``TypeError`` meanwhile). What needs the whole corpus (``len``, ``ds[k]``,
    a shuffled or multi-node plan) waits for the first pass; its errors (and the
    ``seq_len`` check) are raised there. ``first_pass_running()`` says whether it
    still runs, :meth:`streams` whether an iteration now would stream.

    ``source_remote_bytes()`` counts the bytes this process read from the parquet
    files' store (0 once the tokens exist). Raises :class:`ConfigError` on bad
    arguments (before any tokenizing) and when ``seq_len`` is longer than the corpus,
    :class:`SourceDataError` for a missing column or a non-string value (naming the
    file and row), :class:`ShardFormatError` for a file that is not parquet.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        tokenizer: Any,
        seq_len: int,
        cache_dir: str | os.PathLike[str],
        text_field: str = "text",
        eos_id: int | None = None,
        dtype: str = "auto",
        shard_size: int | str = "256MB",
        progress: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = False,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        prefetch_shards: int = 2,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        pattern: str = DEFAULT_PATTERN,
        threads: int = 0,
        stream: bool = False,
        labels: str = "shifted",
    ) -> None:
        from fastload.text.tokenizer import (
            eos_id_of,
            load_tokenizer,
            token_dtype,
            tokenizer_fingerprint,
        )

        # every argument is checked before any file is read or tokenized
        if cache_dir is None:
            raise ConfigError("ParquetTokenDataset needs cache_dir (the node cache)")
        _check_arguments(seq_len=seq_len, text_field=text_field, seed=seed, world=world,
                         window_shards=window_shards, prefetch_shards=prefetch_shards,
                         threads=threads, shuffle=shuffle, stream=stream,
                         labels=labels)  # fmt: skip
        if shuffle is None:
            shuffle = changing_default("ParquetTokenDataset", "shuffle", False, True, SHUFFLE_WHY)
        tok = load_tokenizer(tokenizer)
        tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
        eos = eos_id_of(tok, eos_id, tok_path)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        np_dtype = token_dtype(dtype, vocab)
        if parse_size(shard_size, "shard_size") < np_dtype.itemsize:
            raise ConfigError(f"shard_size {shard_size!r} is smaller than one token")
        self.source_stores: dict[str, ObjectStore] = {}
        files = scan_parquet(url, storage_options, self.source_stores, pattern)
        for f in files:
            if f.columns and text_field not in f.columns:
                raise SourceDataError(
                    f"no column {text_field!r} (columns: {', '.join(f.columns)})", f.url
                )
        fingerprint = tokenizer_fingerprint(tok)
        self.token_dir = token_dir(cache_dir, files, fingerprint, text_field, eos, np_dtype)
        self.tokenized_here = False
        self.pieces_tokenized_here = 0
        self._fetched = 0
        self._streamed = 0  # bytes of tokens served from the pieces (io_stats)
        self.files = files
        meta = {"kind": "tokens", "dtype": np_dtype.name, "vocab_size": vocab, "eos_id": eos,
                "field": text_field, "tokenizer": fingerprint,
                "sources": [f.url for f in files]}  # fmt: skip
        first_pass = FirstPass(files, storage_options, os.fspath(cache_dir), self.token_dir,
                               tok, text_field, eos, np_dtype, shard_size, meta, threads,
                               progress)  # fmt: skip
        self._late = {"seq_len": seq_len, "window_shards": window_shards,
                      "prefetch_shards": prefetch_shards, "url": url}  # fmt: skip
        if stream and not (self.token_dir / "manifest.json").exists():
            # the first pass runs in a thread; the epoch's first iteration serves the
            # windows of the pieces published so far (fastload.text.parquet_stream)
            self._init_plan(shuffle=shuffle, seed=seed, drop_last=drop_last,
                            window_shards=window_shards, prefetch_shards=prefetch_shards,
                            world=world)  # fmt: skip
            self.seq_len, self.labels = seq_len, labels
            self.position_ids, self.cu_seqlens = position_ids, cu_seqlens
            self._pending: _Pending | None = _Pending(first_pass)
            self.pieces_at_first_window: int | None = None
            return
        self._pending = None
        self._finish(first_pass.run(), seq_len=seq_len, shuffle=shuffle, seed=seed,
                     world=world, drop_last=drop_last, window_shards=window_shards,
                     prefetch_shards=prefetch_shards, position_ids=position_ids,
                     cu_seqlens=cu_seqlens, labels=labels)  # fmt: skip

    def _finish(self, done: _Done, **kwargs: Any) -> None:
        """The dataset over the published token shards (once the first pass is done)."""
        self._cache_pin = done.pin
        self.tokenized_here = done.published
        self.pieces_tokenized_here = done.pieces
        self._fetched = done.fetched
        source = _LocalTokenSource(str(self.token_dir), max_open_shards=6)
        super().__init__(str(self.token_dir), source=source, **kwargs)
        if self.layout.num_windows == 0:
            need = self.seq_len + self.layout.extra
            raise ConfigError(
                f"seq_len={self.seq_len} is longer than the corpus: {self._late['url']} "
                f"holds {self.layout.num_tokens} tokens (EOS included) and a window needs "
                f"{need}; use a shorter seq_len or more documents"
            )

    # ------------------------------------------------ a first pass under way
    _LATE = frozenset({"source", "layout"})  # set once the token shards exist

    def __getattr__(self, name: str) -> Any:
        # while the first pass runs (stream=True), what needs the token shards waits
        # for them: len(), ds[k], the shuffled plan, the DataLoader's batches
        if name in ParquetTokenDataset._LATE and self.__dict__.get("_pending") is not None:
            self._ready()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _ready(self) -> None:
        """Wait for the first pass (or run it, in a copy of the dataset made in another
        process) and open the token shards; the plan's state is kept."""
        pending = self.__dict__.get("_pending")
        if pending is None:
            return
        done = pending.wait()
        kept = {k: self.__dict__[k] for k in ("_state", "_yielded", "_skip", "_position",
                                               "_saved_position", "batch_size")}  # fmt: skip
        self._pending = None
        late = self._late
        self._finish(done, seq_len=late["seq_len"], shuffle=self.shuffle, seed=self.seed,
                     world=self.world, drop_last=self.drop_last,
                     window_shards=late["window_shards"],
                     prefetch_shards=late["prefetch_shards"], position_ids=self.position_ids,
                     cu_seqlens=self.cu_seqlens, labels=self.labels)  # fmt: skip
        self.__dict__.update(kept)
        expected = late.pop("num_samples", None)
        if expected is not None and expected != self.num_units:
            raise ConfigError(
                f"loader state was saved with num_samples={expected!r}; this "
                f"{self._state_label} ({self.source.url}) has num_samples={self.num_units!r}"
            )

    def first_pass_running(self) -> bool:
        """Whether this dataset's first pass still runs (``stream=True``)."""
        pending = self.__dict__.get("_pending")
        return pending is not None and pending.running()

    def streams(self) -> bool:
        """Whether an iteration started now serves windows before the token shards
        exist: a first pass running in this process, and an order that needs no total
        count (unshuffled, one canonical node)."""
        pending = self.__dict__.get("_pending")
        if pending is None or not pending.running() or self.shuffle:
            return False
        world = self._world()
        return (self._state.canonical_nodes or world.num_nodes) == 1

    def io_stats(self) -> dict[str, int]:
        """As :meth:`TokenDataset.io_stats` (zeros until the token shards are open),
        plus the bytes of tokens served from the first pass's pieces, counted as
        ``disk_bytes`` (local files)."""
        if self.__dict__.get("_pending") is None:
            stats = super().io_stats()
        else:  # the keys of ShardSource.io_stats
            keys = ("remote_bytes", "disk_bytes", "ram_bytes", "cache_hits", "cache_misses",
                    "uncached_reads", "lease_bypasses")  # fmt: skip
            stats = dict.fromkeys(keys, 0)
        stats["disk_bytes"] += self.__dict__.get("_streamed", 0)
        return stats

    def loader_state(self) -> dict[str, Any]:
        """As :meth:`TokenDataset.loader_state`; while the first pass runs, without
        ``num_samples`` (not known yet)."""
        if self.__dict__.get("_pending") is None:
            return super().loader_state()
        world = self._world()
        return {"seed": self.seed, "epoch": self.epoch,
                "canonical_nodes": self._state.canonical_nodes or world.num_nodes,
                "shuffle": self.shuffle, "window_shards": self.window_shards,
                **self._state_extra()}  # fmt: skip

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """As :meth:`TokenDataset.load_loader_state`; while the first pass runs, the
        sample count is checked once the token shards exist."""
        if self.__dict__.get("_pending") is None:
            super().load_loader_state(state)
            return
        if state.get("num_samples") is not None:
            self._late["num_samples"] = state["num_samples"]
        mine = {"shuffle": self.shuffle, "window_shards": self.window_shards,
                **self._state_extra()}  # fmt: skip
        for name, value in mine.items():
            if name in state and state[name] != value:
                raise ConfigError(
                    f"loader state was saved with {name}={state[name]!r}; this "
                    f"{self._state_label} ({self.token_dir}) has {name}={value!r}"
                )
        self._state = dataclasses.replace(
            self._state, seed=int(state["seed"]), epoch=int(state.get("epoch", self.epoch)),
            canonical_nodes=state.get("canonical_nodes"),
        )  # fmt: skip

    def _resume_started(self) -> Any:
        if self.__dict__.get("_pending") is None:
            return super()._resume_started()
        return self._state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self.streams():
            self._ready()
            yield from super().__iter__()
            return
        yield from self._stream()

    def _walk(
        self, world: World, state: SamplerState, batch: int, first: int, stride: int
    ) -> Iterator[tuple[range, PieceReader]]:
        """This rank's windows of full global steps ``first, first + stride, ..`` from
        the published pieces (:func:`~fastload.text.parquet_stream.full_steps`), each
        once its pieces exist, with the reader holding them; ends where the rest must
        come from the finished plan."""
        pending: _Pending | None = self.__dict__.get("_pending")
        if pending is None:  # opened meanwhile
            return
        reader = PieceReader(pending.first_pass.pieces_dir, pending.count, self.seq_len,
                             self.token_dir / "manifest.json", hf=self.labels == "hf",
                             itemsize=pending.first_pass.dtype.itemsize)  # fmt: skip

        def running(p: _Pending = pending) -> bool:  # and this dataset not opened meanwhile
            return self.__dict__.get("_pending") is p and p.running()

        self.pieces_at_first_window = None
        for ks in full_steps(reader, running, consumed=state.samples_consumed,
                             steps=itertools.count(first, stride),
                             global_batch=world.world_size * batch, slot=world.slot,
                             batch=batch):  # fmt: skip
            if self.pieces_at_first_window is None:
                self.pieces_at_first_window = reader.published()
            yield ks, reader

    def _stream(self) -> Iterator[dict[str, Any]]:
        """This worker's windows of the unshuffled, one-node epoch, each served once the
        pieces holding it are published: full global steps by :meth:`_walk`, the
        epoch's last (short) step from the finished plan, whose order is the same (so
        a state saved here resumes on the finished dataset, and the other way round)."""
        world = self._world()
        batch, workers, worker = self.batch_size, world.num_workers, world.worker
        skip = self._start_position((worker, workers))
        pos = 0
        for ks, reader in self._walk(world, self._state, batch, worker, workers):
            for k in ks:
                if pos >= skip:
                    self._yielded = pos + 1
                    self._streamed += reader.window_bytes  # io_stats
                    yield reader.item(k, self.position_ids, self.cu_seqlens)
                pos += 1
        self._ready()  # published (or failed): the finished plan from here
        mine = worker_indices(self.rank_plan(world), batch, workers, worker)
        for q in range(max(pos, skip), mine.size):
            self._yielded = q + 1
            yield self.window(int(mine[q]))

    def stream_steps(self) -> Iterator[tuple[range | np.ndarray, PieceReader | None]]:
        """This rank's batches of the epoch as :class:`fastload.DataLoader` builds them
        in its own process (the rank's windows, no worker split), while
        :meth:`streams`: ``(windows, reader)`` for each full global step once the
        pieces holding it are published (consecutive windows, read from ``reader``
        with :meth:`PieceReader.span`), then, once the first pass is done,
        ``(windows, None)`` for the rest of the finished plan's batches (global window
        indices in the token shards; the last short unless ``drop_last``). Planned
        with the batch size, world and resume point set now: a later
        :meth:`configure` (a loader's ``state_dict``) does not move it."""
        return self._steps(self._world(), self._state, self.batch_size, self.drop_last)

    def _steps(
        self, world: World, state: SamplerState, batch: int, drop_last: bool
    ) -> Iterator[tuple[range | np.ndarray, PieceReader | None]]:
        done = 0
        for ks, reader in self._walk(world, state, batch, 0, 1):
            self._streamed += reader.window_bytes * len(ks)  # io_stats
            yield ks, reader
            done += 1
        self._ready()
        # the finished plan after the full steps served: the same order from there on
        st = state.advanced(done, world.world_size * batch)
        st = dataclasses.replace(st, canonical_nodes=st.canonical_nodes or world.num_nodes)
        rest = plan_from_state(st.started(world, batch, self.num_units), self.unit_counts(),
                               world, batch, shuffle=False, drop_last=drop_last,
                               window_shards=self.window_shards, pad=self._pad)  # fmt: skip
        n = -(-rest.size // batch) if not drop_last else rest.size // batch
        for j in range(n):
            yield rest[j * batch : (j + 1) * batch], None

    def close(self) -> None:
        """Release open shards and background threads of this process; while the first
        pass runs (``stream=True``) it goes on (the node's tokens), and nothing is
        open yet."""
        if self.__dict__.get("_pending") is None:
            super().close()

    def source_remote_bytes(self) -> int:
        """Bytes this process fetched from the parquet files' store(s), counted by
        their :class:`~fastload.storage.ObjectStore`: footers at start-up, and the
        whole files when it tokenized them (nothing once the node has the tokens)."""
        footers = sum(s.stats().bytes_read for s in self.source_stores.values())
        return int(footers + self._fetched)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["source_stores"] = {}  # counters are per process
        return state
