"""Text benchmarks, each against its baseline in the same run, over the same parquet
files on a local SeaweedFS:

1. **Epoch 2 of ``ParquetTokenDataset(..., tokenizer=...)``** (windows read from the
   node's token cache) against ``datasets.load_dataset("parquet", data_files=...,
   streaming=True, storage_options=...)`` with the same tokenizer and the same
   packing (documents in order, EOS after each, windows of ``seq_len + 1``), which
   downloads and tokenizes the files again every epoch. Also: bytes fetched from the
   store in fastload's epoch 2, counted by its object stores.
2. **``TokenDataset`` through ``fastload.DataLoader``** over ``--loader-tokens`` token
   ids in token shards (2 workers asked for, ``seq_len=2048``, batch 8, int64 tensors;
   timed after a warm-up epoch; the loader builds these batches in its own process,
   see ``fastload.loader.token_batches``) against a plain loop over the same mapped
   shard files (numpy slices of each window, stacked into the same batches), cache
   warm. Also: the same with 0 workers, torch's path (``transport="pickle"``, 2
   persistent workers), and torch's DataLoader over constant items of the same shape.
   With ``--labels hf``: also ``TokenDataset(labels="hf")`` (unshifted labels with
   -100, ``attention_mask``), with and without ``position_ids=True``, through
   ``fastload.DataLoader``, and the per-item reference (the dataset's items, one
   window at a time, stacked into the same batches).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_text.py [--docs 6000 --files 4
--loader-tokens 64000000 --repeats 3 --fast-repeats 3 --only all|epoch2|loader
--labels shifted|hf --json out.json]``.
Prints one line per case (median of the runs, spread) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import torch

import fastload
from fastload.bench.local_s3 import LocalS3
from fastload.shards.writer import ShardWriter
from fastload.storage import open_store
from fastload.text import synthetic
from fastload.text.tokens import TokenSource
from fastload.text.writer import TokenShardWriter


def make_corpus(n: int, seed: int) -> list[str]:
    """Documents of Zipf-distributed synthetic words (50..600 words each)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(6000)]
    weights = [1.0 / (r + 1) for r in range(len(words))]
    out = []
    for _ in range(n):
        k = rng.randint(50, 600)
        out.append(" ".join(rng.choices(words, weights, k=k)) + ".")
    return out


def train_tokenizer(corpus: list[str], path: str) -> Any:
    return synthetic.train_tokenizer(corpus, path, vocab_size=8192)


def pack(
    tokenizer: Any, texts: list[str], eos: int, carry: np.ndarray, seq_len: int
) -> tuple[int, np.ndarray]:
    """The shared packing: encode, EOS after each, cut windows of seq_len + 1 tokens
    (consecutive windows share one token). Returns (windows made, the leftover)."""
    parts = [carry]
    for enc in tokenizer.encode_batch(texts):
        parts.append(np.asarray(enc.ids, dtype=np.int64))
        parts.append(np.array([eos], dtype=np.int64))
    stream = np.concatenate(parts)
    n = max(0, (stream.size - 1) // seq_len)
    for k in range(n):
        window = stream[k * seq_len : (k + 1) * seq_len + 1]
        torch.from_numpy(window[:-1].copy()), torch.from_numpy(window[1:].copy())
    return n, stream[n * seq_len :]


def hf_streaming_epoch(urls: list[str], s3fs_options: dict[str, Any], tokenizer: Any, eos: int,
                       seq_len: int) -> tuple[float, int]:  # fmt: skip
    import datasets

    ds = datasets.load_dataset(
        "parquet", data_files=urls, split="train", streaming=True, storage_options=s3fs_options
    )
    t0 = time.perf_counter()
    carry = np.zeros(0, dtype=np.int64)
    windows = 0
    for batch in ds.iter(batch_size=1000):
        n, carry = pack(tokenizer, batch["text"], eos, carry, seq_len)
        windows += n
    return time.perf_counter() - t0, windows


def fastload_epoch(ds: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    windows = 0
    for _ in ds:
        windows += 1
    return time.perf_counter() - t0, windows


def loader_epoch(loader: Any) -> tuple[float, int]:
    """One epoch of a (persistent-worker) loader: steady-state throughput."""
    t0 = time.perf_counter()
    tokens = 0
    for b in loader:
        tokens += int(b["input_ids"].numel())
    return time.perf_counter() - t0, tokens


def plain_loop_epoch(paths: list[tuple[Path, int, int]], dtype: np.dtype[Any], seq_len: int,
                     batch: int) -> tuple[float, int]:  # fmt: skip
    """Windows sliced from each mapped shard in order, stacked into int64 batches
    (no dataset, no workers, no cross-shard windows)."""
    t0 = time.perf_counter()
    tokens = 0
    pending: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    for path, offset, count in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = np.frombuffer(m, dtype, count=count, offset=offset)
            for k in range((count - 1) // seq_len):
                w = view[k * seq_len : (k + 1) * seq_len + 1].astype(np.int64)
                pending.append(torch.from_numpy(w[:-1]))
                labels.append(torch.from_numpy(w[1:]))
                if len(pending) == batch:
                    x = torch.stack(pending)
                    torch.stack(labels)
                    tokens += int(x.numel())
                    pending, labels = [], []
            del view
    return time.perf_counter() - t0, tokens


def item_loop_epoch(ds: Any, batch: int) -> tuple[float, int]:
    """The dataset's items one window at a time, each field stacked into batches (the
    per-item path of labels="hf" that the loader's batch path replaces)."""
    t0 = time.perf_counter()
    tokens = 0
    pending: list[dict[str, torch.Tensor]] = []
    for item in ds:
        pending.append(item)
        if len(pending) == batch:
            x = {k: torch.stack([it[k] for it in pending]) for k in pending[0]}
            tokens += int(x["input_ids"].numel())
            pending = []
    return time.perf_counter() - t0, tokens


class _ConstantWindows(torch.utils.data.IterableDataset[Any]):
    """The ceiling of torch's worker IPC: the same item shape, made from nothing."""

    def __init__(self, n: int, seq_len: int) -> None:
        self.n, self.seq_len = n, seq_len

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        t = torch.arange(self.seq_len + 1)
        for i in range(self.n):
            if i // 8 % nw == w:
                yield {"input_ids": t[:-1].clone(), "labels": t[1:].clone()}


def write_random_tokens(url: str, storage_options: dict[str, Any], n: int, eos: int) -> None:
    rng = np.random.default_rng(0)
    dtype = np.dtype("<u2")
    meta: dict[str, Any] = {"kind": "tokens", "dtype": "uint16", "vocab_size": 8192,
                            "eos_id": eos, "field": "text", "tokenizer": "random"}  # fmt: skip
    writer = ShardWriter(url, "32MB", storage_options, meta)
    shards = TokenShardWriter(writer, dtype)
    done = 0
    while done < n:
        lengths = rng.integers(50, 3000, size=1000)
        tokens = rng.integers(0, 8192, size=int(lengths.sum()), dtype=np.int64).astype(dtype)
        shards.add(tokens, lengths)
        done += tokens.size
    shards.close()
    meta.update(tokens=int(sum(shards.shard_tokens)), documents=int(sum(shards.shard_docs)),
                shard_tokens=shards.shard_tokens, shard_docs=shards.shard_docs)  # fmt: skip
    writer.source = meta
    writer.close()


def stats(name: str, times: list[float], tokens: int) -> dict[str, Any]:
    med = statistics.median(times)
    row = {"case": name, "median_s": med, "min_s": min(times), "max_s": max(times),
           "tokens": tokens, "tokens_per_s": tokens / med}  # fmt: skip
    print(f"{name:<52} median {med:7.2f} s [{min(times):.2f}..{max(times):.2f}]  "
          f"{tokens / med / 1e6:6.2f} M tokens/s", flush=True)  # fmt: skip
    return row


def epoch2_section(args: Any, tmp: Path, s3: Any, bucket: str) -> tuple[list[Any], dict[str, Any]]:
    """Epoch 2 of ParquetTokenDataset against datasets streaming (section 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = make_corpus(args.docs, seed=0)
    tok = train_tokenizer(corpus[:2000], str(tmp / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    root = f"s3://{bucket}/pq"
    store = open_store(root, s3.storage_options)
    step = -(-len(corpus) // args.files)
    for k in range(args.files):
        local = tmp / f"part-{k:05d}.parquet"
        pq.write_table(pa.table({"text": corpus[k * step : (k + 1) * step]}), local,
                       row_group_size=1000)  # fmt: skip
        store.write_bytes(local.name, local.read_bytes())
    urls = [f"{root}/part-{k:05d}.parquet" for k in range(args.files)]
    parquet_bytes = sum((tmp / f"part-{k:05d}.parquet").stat().st_size for k in range(args.files))
    print(f"{args.docs} documents, {args.files} parquet files, {parquet_bytes / 1e6:.1f} MB "
          f"on {s3.endpoint_url}", flush=True)  # fmt: skip

    t0 = time.perf_counter()
    pds: Any = fastload.ParquetTokenDataset(root, tokenizer=str(tmp / "tokenizer.json"),
                                            seq_len=args.seq_len, cache_dir=tmp / "cache",
                                            storage_options=s3.storage_options,
                                            shuffle=False,
                                            world=fastload.World.single())  # fmt: skip
    tokenize_s = time.perf_counter() - t0
    print(f"ParquetDataset first use (download + tokenize once): {tokenize_s:.2f} s", flush=True)
    fastload_epoch(pds)  # epoch 1
    before = pds.source_remote_bytes()
    fl_times, hf_times = [], []
    fl_windows = hf_windows = 0
    for _ in range(args.repeats):
        dt, fl_windows = fastload_epoch(pds)
        fl_times.append(dt)
        dt, hf_windows = hf_streaming_epoch(urls, s3.s3fs_options(), tok, eos, args.seq_len)
        hf_times.append(dt)
    epoch2_bytes = pds.source_remote_bytes() - before
    tk_times = []
    for _ in range(args.repeats):  # the ceiling of anything that tokenizes every epoch
        t1 = time.perf_counter()
        carry = np.zeros(0, dtype=np.int64)
        for i in range(0, len(corpus), 1000):
            _, carry = pack(tok, corpus[i : i + 1000], eos, carry, args.seq_len)
        tk_times.append(time.perf_counter() - t1)
    pds.close()
    if fl_windows != hf_windows:
        raise SystemExit(f"window counts differ: fastload {fl_windows}, datasets {hf_windows}")
    tokens = fl_windows * args.seq_len
    a = stats("epoch 2: ParquetDataset(tokenizer=) from node cache", fl_times, tokens)
    b = stats("epoch 2: datasets streaming + tokenize + pack", hf_times, tokens)
    t = stats("tokenizer + pack alone, text in RAM (ceiling of b)", tk_times, tokens)
    ratio1 = a["tokens_per_s"] / b["tokens_per_s"]
    print(f"  ratio {ratio1:.1f}x; bytes fetched from the store in fastload's epoch 2: "
          f"{epoch2_bytes}", flush=True)  # fmt: skip
    return [a, b, t], {"epoch2_ratio": ratio1, "epoch2_store_bytes": epoch2_bytes,
                       "tokenize_once_s": tokenize_s}  # fmt: skip


def loader_section(args: Any, tmp: Path, s3: Any, bucket: str) -> tuple[list[Any], dict[str, Any]]:
    """TokenDataset through fastload.DataLoader against a plain loop (section 2)."""
    # token shards of --loader-tokens random ids in documents of 50..3000 tokens,
    # written by convert.text's own shard writer, served from the store through a
    # fresh node cache (large enough that per-epoch costs do not dominate)
    tokens_url = f"s3://{bucket}/tokens"
    write_random_tokens(tokens_url, s3.storage_options, args.loader_tokens, eos=2)
    cache = tmp / "cache2"
    tds = fastload.TokenDataset(tokens_url, seq_len=args.seq_len, cache_dir=cache,
                                shuffle=False, storage_options=s3.storage_options)  # fmt: skip
    single = fastload.World.single()
    loader = fastload.DataLoader(tds, batch_size=args.batch, num_workers=args.workers,
                                 drop_last=True, persistent_workers=True,
                                 world=single)  # fmt: skip
    print(f"loader: transport={loader.transport}, worker processes={loader.worker_processes}",
          flush=True)  # fmt: skip
    loader_epoch(loader)  # warm the cache
    src = TokenSource(tokens_url, storage_options=s3.storage_options, cache_dir=cache)
    shards: list[tuple[Path, int, int]] = []
    for s in range(len(src.manifest.shards)):
        cached = src.shard(s)
        (offset, _), _ = src._spans_of(s)
        assert cached.path is not None
        shards.append((cached.path, offset, src.shard_tokens[s]))
    inproc = fastload.DataLoader(tds, batch_size=args.batch, num_workers=0, drop_last=True,
                                 world=single)  # fmt: skip
    shuffled_ds = fastload.TokenDataset(tokens_url, seq_len=args.seq_len, cache_dir=cache,
                                        shuffle=True,
                                        storage_options=s3.storage_options)  # fmt: skip
    shuffled = fastload.DataLoader(shuffled_ds, batch_size=args.batch, num_workers=args.workers,
                                   drop_last=True, world=single)  # fmt: skip
    pickled = fastload.DataLoader(tds, batch_size=args.batch, num_workers=args.workers,
                                  drop_last=True, persistent_workers=True, world=single,
                                  transport="pickle")  # fmt: skip
    loader_epoch(pickled)  # start its workers
    ceiling = torch.utils.data.DataLoader(
        _ConstantWindows(len(tds) // args.batch * args.batch, args.seq_len),
        batch_size=args.batch, num_workers=args.workers, persistent_workers=True,
    )  # fmt: skip
    loader_epoch(ceiling)
    cases: dict[str, tuple[list[float], list[int]]] = {
        k: ([], [0]) for k in ("loader", "plain", "inproc", "shuffled", "pickle", "ceiling")
    }
    fast = [
        ("loader", lambda: loader_epoch(loader)),
        ("plain", lambda: plain_loop_epoch(shards, src.dtype, args.seq_len, args.batch)),
        ("inproc", lambda: loader_epoch(inproc)),
        ("shuffled", lambda: loader_epoch(shuffled)),
    ]
    slow = [("pickle", lambda: loader_epoch(pickled)), ("ceiling", lambda: loader_epoch(ceiling))]
    hf_sets = []
    if args.labels == "hf":
        for name, extra in (("hf", {}), ("hf_pos", {"position_ids": True})):
            hds = fastload.TokenDataset(tokens_url, seq_len=args.seq_len, cache_dir=cache,
                                        shuffle=False, labels="hf",
                                        storage_options=s3.storage_options, **extra)  # fmt: skip
            hf_sets.append(hds)
            hl = fastload.DataLoader(hds, batch_size=args.batch, num_workers=args.workers,
                                     drop_last=True, world=single)  # fmt: skip
            fast.append((name, lambda hl=hl: loader_epoch(hl)))
            cases[name] = ([], [0])
        fast.append(("hf_items", lambda: item_loop_epoch(hf_sets[0], args.batch)))
        cases["hf_items"] = ([], [0])
    for _ in range(args.repeats):
        # the fast epochs take a fraction of a second: each runs --fast-repeats times
        # per repeat, interleaved, so a neighbour's burst does not decide a median
        for name, run in fast * args.fast_repeats + slow:
            dt, n = run()
            cases[name][0].append(dt)
            cases[name][1][0] = n
    c = stats(f"TokenDataset + DataLoader({args.workers} workers asked, batch {args.batch})",
              *_case(cases["loader"]))  # fmt: skip
    d = stats("plain loop over the mapped shards", *_case(cases["plain"]))
    e = stats(f"TokenDataset + DataLoader(0 workers, batch {args.batch})", *_case(cases["inproc"]))
    sh = stats(f"TokenDataset(shuffle=True) + DataLoader({args.workers} workers asked)",
               *_case(cases["shuffled"]))  # fmt: skip
    p = stats(f"TokenDataset + DataLoader({args.workers} workers, transport='pickle')",
              *_case(cases["pickle"]))  # fmt: skip
    f = stats(f"torch DataLoader({args.workers} workers) over constant tensors",
              *_case(cases["ceiling"]))  # fmt: skip
    ratio2 = c["tokens_per_s"] / d["tokens_per_s"]
    zero = e["tokens_per_s"] / d["tokens_per_s"]
    pickle_ratio = p["tokens_per_s"] / d["tokens_per_s"]
    shuffled_ratio = sh["tokens_per_s"] / d["tokens_per_s"]
    of_ceiling = c["tokens_per_s"] / f["tokens_per_s"]
    print(f"  ratio {ratio2:.2f}x of the plain loop; {zero:.2f}x with 0 workers; "
          f"{shuffled_ratio:.2f}x shuffled; {pickle_ratio:.2f}x through torch's workers "
          "(pickle); "
          f"{of_ceiling:.2f}x of torch's worker ceiling", flush=True)  # fmt: skip
    rows = [c, d, e, sh, p, f]
    figures = {"loader_ratio": ratio2, "loader_ratio_0_workers": zero,
               "loader_ratio_pickle": pickle_ratio, "loader_ratio_shuffled": shuffled_ratio,
               "loader_of_torch_ceiling": of_ceiling}  # fmt: skip
    if hf_sets:
        h = stats(f"TokenDataset(labels='hf') + DataLoader(batch {args.batch})",
                  *_case(cases["hf"]))  # fmt: skip
        hp = stats("TokenDataset(labels='hf', position_ids=True) + DataLoader",
                   *_case(cases["hf_pos"]))  # fmt: skip
        hi = stats("labels='hf' items one by one, stacked (reference)", *_case(cases["hf_items"]))
        rows += [h, hp, hi]
        figures.update(
            hf_of_windows=h["tokens_per_s"] / c["tokens_per_s"],
            hf_of_plain=h["tokens_per_s"] / d["tokens_per_s"],
            hf_pos_of_windows=hp["tokens_per_s"] / c["tokens_per_s"],
            hf_of_items=h["tokens_per_s"] / hi["tokens_per_s"],
        )
        print(f"  labels='hf': {figures['hf_of_windows']:.2f}x of the loader's plain windows "
              f"({figures['hf_of_plain']:.2f}x of the plain loop), with position_ids "
              f"{figures['hf_pos_of_windows']:.2f}x; {figures['hf_of_items']:.2f}x the "
              "per-item reference", flush=True)  # fmt: skip
        for hds in hf_sets:
            hds.close()
    src.close()
    tds.close()
    shuffled_ds.close()
    return rows, figures


def _case(case: tuple[list[float], list[int]]) -> tuple[list[float], int]:
    return case[0], case[1][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loader-tokens", type=int, default=64_000_000)
    ap.add_argument("--fast-repeats", type=int, default=3,
                    help="runs per repeat of the loader section's fast cases")  # fmt: skip
    ap.add_argument(
        "--only",
        choices=("all", "epoch2", "loader"),
        default="all",
        help="run one section: epoch2 (parquet) or loader (token windows)",
    )
    ap.add_argument("--labels", choices=("shifted", "hf"), default="shifted",
                    help="hf: also time TokenDataset(labels='hf') (loader section)")  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-text-") as tmp_s, LocalS3() as s3:
        tmp = Path(tmp_s)
        bucket = s3.new_bucket()
        sections = {"epoch2": epoch2_section, "loader": loader_section}
        for name, section in sections.items():
            if args.only in ("all", name):
                got, figures = section(args, tmp, s3, bucket)
                rows += got
                summary.update(figures)
    if args.json:
        env = {"python": platform.python_version(), "machine": platform.machine(),
               "cpus": os.cpu_count(), "torch": torch.__version__}  # fmt: skip
        doc = {"version": 1, "args": vars(args), "env": env, "rows": rows, **summary}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
