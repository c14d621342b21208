"""Epoch 1 and epoch 2 of ``ParquetDataset(tokenizer=...)`` (``ParquetTokenDataset``)
against its baselines, in one run, over the same parquet files on a local SeaweedFS
and the same tokenizer:

- **tokenizer alone**: ``Tokenizer.encode_batch`` (batches of 1000, every core) over
  the same text already in RAM, plus EOS and packing: the bound of any first pass;
- **datasets streaming**: ``datasets.load_dataset("parquet", data_files=...,
  streaming=True, storage_options=...)``, the same batched ``encode_batch`` and the
  same packing (documents in order, EOS after each, windows of ``seq_len + 1``);
- **fastload epoch 1**: a fresh node cache, ``ParquetDataset(url, tokenizer=...)``
  built (download, tokenize on every core, write the token shards) and every window
  read once; **streamed** (``stream=True``): the same, windows served while the
  first pass still tokenizes.

``fastload convert text`` of the same files into token shards is timed too, through
the tokenizing pool it uses now and through the one-batch-at-a-time loop it used
before (``encode_documents``; the same shards, byte for byte).

The **time to the first window** of epoch 1 in one process is recorded for the
streaming baseline and both fastload cases, and given as a fraction of the same
case's epoch (``first_window_fraction_*``): how much of the epoch a training loop
waits before its first step. Through the loaders, the **time to the first batch**
likewise: torch's DataLoader over the streaming baseline, ``fastload.DataLoader``
over the default dataset (it waits for the whole first pass) and over
``stream=True`` (batches while the first pass still tokenizes).

Each in one process, and through a DataLoader with ``--workers`` workers (fastload:
``fastload.DataLoader``; datasets: torch's DataLoader over the streaming dataset,
which splits the files among the workers); then epoch 2 of the fastload loader (the
token cache) against the streaming baseline. Ratios are tokens/s over tokens/s of
the same windows (``seq_len``, batch ``--batch``).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_parquet_tokens.py [--docs 40000
--files 8 --seq-len 2048 --batch 8 --workers 2 --repeats 1 --json out.json]``
(``--docs 4000`` for a quick run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import torch
import torch.utils.data

import fastload
from fastload.bench.local_s3 import LocalS3
from fastload.storage import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_text import make_corpus, pack, train_tokenizer


class _Streamed(torch.utils.data.IterableDataset[Any]):
    """datasets streaming + encode_batch + packing, as a torch dataset: each worker
    streams its share of the files (datasets splits them) and packs its own stream."""

    def __init__(self, urls: list[str], options: dict[str, Any], tok_path: str, eos: int,
                 seq_len: int) -> None:  # fmt: skip
        self.urls, self.options, self.tok_path = urls, options, tok_path
        self.eos, self.seq_len = eos, seq_len

    def __iter__(self) -> Any:
        import tokenizers

        import datasets

        tok = tokenizers.Tokenizer.from_file(self.tok_path)
        ds = datasets.load_dataset("parquet", data_files=self.urls, split="train",
                                   streaming=True, storage_options=self.options)  # fmt: skip
        info = torch.utils.data.get_worker_info()
        if info is not None:
            ds = ds.shard(num_shards=info.num_workers, index=info.id)
        carry = np.zeros(0, dtype=np.int64)
        L = self.seq_len
        for batch in ds.iter(batch_size=1000):
            parts = [carry]
            for enc in tok.encode_batch(batch["text"]):
                parts.append(np.asarray(enc.ids, dtype=np.int64))
                parts.append(np.array([self.eos], dtype=np.int64))
            stream = np.concatenate(parts)
            n = max(0, (stream.size - 1) // L)
            for k in range(n):
                w = torch.from_numpy(stream[k * L : (k + 1) * L + 1].copy())
                yield {"input_ids": w[:-1], "labels": w[1:]}
            carry = stream[n * L :]


def hf_one_process(urls: list[str], options: dict[str, Any], tok: Any, eos: int,
                   seq_len: int) -> tuple[float, int]:  # fmt: skip
    import datasets

    t0 = time.perf_counter()
    ds = datasets.load_dataset("parquet", data_files=urls, split="train", streaming=True,
                               storage_options=options)  # fmt: skip
    carry = np.zeros(0, dtype=np.int64)
    windows = 0
    first = 0.0
    for batch in ds.iter(batch_size=1000):
        n, carry = pack(tok, batch["text"], eos, carry, seq_len)
        windows += n
        if n and not first:
            first = time.perf_counter() - t0
    return time.perf_counter() - t0, windows * seq_len, first


def drain(loader: Any, t0: float) -> tuple[float, int, float]:
    """Every batch of ``loader``: (seconds since ``t0``, window tokens, seconds to the
    first batch)."""
    tokens, first = 0, 0.0
    for b in loader:
        tokens += int(b["input_ids"].numel())
        if not first:
            first = time.perf_counter() - t0
    return time.perf_counter() - t0, tokens, first


def hf_loader(args: Any, urls: list[str], options: dict[str, Any], tok_path: str,
              eos: int) -> tuple[float, int, float]:  # fmt: skip
    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        _Streamed(urls, options, tok_path, eos, args.seq_len), batch_size=args.batch,
        num_workers=args.workers,
    )  # fmt: skip
    return drain(loader, t0)


def fresh(cache: Path) -> Path:
    """A new, empty cache directory beside ``cache`` for each run: a node cache deleted
    under a live process is not one this process's disk tier can use again."""
    cache.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=cache))


def fastload_dataset(url: str, options: dict[str, Any], tok_path: str, cache: Path,
                     seq_len: int, **kwargs: Any) -> Any:  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the spelling
        return fastload.ParquetDataset(url, tokenizer=tok_path, seq_len=seq_len,
                                       cache_dir=cache, storage_options=options,
                                       shuffle=False, world=fastload.World.single(),
                                       **kwargs)  # fmt: skip


def fl_one_process(args: Any, url: str, options: dict[str, Any], tok_path: str,
                   cache: Path, stream: bool = False) -> tuple[float, int, float]:  # fmt: skip
    cache = fresh(cache)
    t0 = time.perf_counter()
    ds = fastload_dataset(url, options, tok_path, cache, args.seq_len, stream=stream)
    windows, first = 0, 0.0
    for _ in ds:
        windows += 1
        if windows == 1:
            first = time.perf_counter() - t0
    dt = time.perf_counter() - t0
    ds.close()
    return dt, windows * args.seq_len, first


def fl_loader(args: Any, url: str, options: dict[str, Any], tok_path: str,
              cache: Path, stream: bool = False) -> tuple[float, int, float, Any]:  # fmt: skip
    """Epoch 1 through ``fastload.DataLoader`` (``stream``: over ``stream=True``, whose
    batches come while the first pass still tokenizes); the loader is returned for
    epoch 2."""
    cache = fresh(cache)
    t0 = time.perf_counter()
    ds = fastload_dataset(url, options, tok_path, cache, args.seq_len, stream=stream)
    loader = fastload.DataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                                 world=fastload.World.single(),
                                 persistent_workers=True)  # fmt: skip
    return (*drain(loader, t0), loader)


def convert(url: str, options: dict[str, Any], tok_path: str, out: Path,
            pool: bool) -> tuple[float, int]:  # fmt: skip
    """``fastload.convert.text`` (``pool``), or the one-batch loop it replaced."""
    from fastload.shards.report import ErrorPolicy
    from fastload.shards.writer import ShardWriter
    from fastload.text.sources import list_sources, read_documents
    from fastload.text.tokenizer import load_tokenizer, token_dtype
    from fastload.text.writer import TokenShardWriter, encode_documents

    out.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="convert-", dir=out))
    t0 = time.perf_counter()
    if pool:
        report = fastload.convert.text(url, str(out), tokenizer=tok_path, storage_options=options)
        return time.perf_counter() - t0, report.tokens
    tok = load_tokenizer(tok_path)
    dtype = token_dtype("auto", tok.get_vocab_size(with_added_tokens=True))
    writer = ShardWriter(str(out), "256MB", None, {"kind": "tokens"})
    shards = TokenShardWriter(writer, dtype)
    docs = read_documents(list_sources(url, options), "text", ErrorPolicy("raise"), options)
    for tokens, lengths in encode_documents(tok, docs, tok.token_to_id("</s>"), dtype, {}):
        shards.add(tokens, lengths)
    shards.close()
    writer.close()
    return time.perf_counter() - t0, int(sum(shards.shard_tokens))


def tokenizer_alone(texts: list[str], tok: Any, eos: int, seq_len: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    carry = np.zeros(0, dtype=np.int64)
    windows = 0
    for i in range(0, len(texts), 1000):
        n, carry = pack(tok, texts[i : i + 1000], eos, carry, seq_len)
        windows += n
    return time.perf_counter() - t0, windows * seq_len


def row(name: str, times: list[float], tokens: int) -> dict[str, Any]:
    med = statistics.median(times)
    print(f"{name:<58} median {med:7.2f} s [{min(times):.2f}..{max(times):.2f}]  "
          f"{tokens / med / 1e6:6.2f} M tokens/s", flush=True)  # fmt: skip
    return {"case": name, "median_s": med, "min_s": min(times), "max_s": max(times),
            "tokens": tokens, "tokens_per_s": tokens / med}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=40000, help="documents (~390 tokens each)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-group", type=int, default=1000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--epoch2-repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tokenizers

    env = {"python": platform.python_version(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "tokenizers": tokenizers.__version__,
           "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
           "machine": platform.machine()}  # fmt: skip
    print(json.dumps(env), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-pqtok-") as tmp_s, LocalS3() as s3:
        tmp = Path(tmp_s)
        corpus = make_corpus(args.docs, seed=0)
        tok_path = str(tmp / "tokenizer.json")
        tok = train_tokenizer(corpus[:2000], tok_path)
        tok = tokenizers.Tokenizer.from_file(tok_path)  # fresh: as every case loads it
        eos = tok.token_to_id("</s>")
        url = f"s3://{s3.new_bucket()}/pq"
        store = open_store(url, s3.storage_options)
        step = -(-len(corpus) // args.files)
        urls, size = [], 0
        for k in range(args.files):
            local = tmp / f"part-{k:05d}.parquet"
            pq.write_table(pa.table({"text": corpus[k * step : (k + 1) * step]}), local,
                           row_group_size=args.row_group)  # fmt: skip
            store.write_bytes(local.name, local.read_bytes())
            size += local.stat().st_size
            urls.append(f"{url}/{local.name}")
            local.unlink()
        opts, hf_opts = s3.storage_options, s3.s3fs_options()
        cache = tmp / "cache"
        cases: dict[str, tuple[list[float], list[int]]] = {}
        cpu: dict[str, list[float]] = {}
        firsts: dict[str, list[float]] = {}

        def cpu_now() -> float:
            t = os.times()  # this process and its waited-for children (workers)
            return t.user + t.system + t.children_user + t.children_system

        def run(name: str, result: tuple[Any, ...], cpu_s: float = 0.0) -> None:
            times, toks = cases.setdefault(name, ([], []))
            times.append(result[0])
            toks.append(result[1])
            cpu.setdefault(name, []).append(cpu_s)
            if len(result) > 2:  # the time to the first window
                firsts.setdefault(name, []).append(result[2])

        T, H1, F1 = "tokenizer alone (text in RAM)", "datasets streaming, 1 process", \
            "fastload epoch 1, 1 process"  # fmt: skip
        HL, FL = f"datasets streaming, DataLoader {args.workers} workers", \
            f"fastload epoch 1, fastload.DataLoader {args.workers} workers"  # fmt: skip
        F2 = f"fastload epoch 2, fastload.DataLoader {args.workers} workers"
        FLS = f"fastload epoch 1 stream=True, fastload.DataLoader {args.workers} workers"
        FS = "fastload epoch 1 streamed (stream=True), 1 process"
        CP, CL = "convert text (tokenizing pool)", "convert text, one-batch loop (before)"
        loaders: list[Any] = []

        def fl_loader_case() -> tuple[float, int, float]:
            if loaders:
                loaders.pop().close()
            dt, n, first, loader = fl_loader(args, url, opts, tok_path, cache)
            loaders.append(loader)
            return dt, n, first

        def fl_streamed_loader_case() -> tuple[float, int, float]:
            dt, n, first, loader = fl_loader(args, url, opts, tok_path, cache, stream=True)
            loader.close()
            return dt, n, first

        order = [
            (F1, lambda: fl_one_process(args, url, opts, tok_path, cache)),
            (FS, lambda: fl_one_process(args, url, opts, tok_path, cache, stream=True)),
            (CP, lambda: convert(url, opts, tok_path, tmp / "converted", pool=True)),
            (CL, lambda: convert(url, opts, tok_path, tmp / "converted", pool=False)),
            (H1, lambda: hf_one_process(urls, hf_opts, tok, eos, args.seq_len)),
            (T, lambda: tokenizer_alone(corpus, tok, eos, args.seq_len)),
            (HL, lambda: hf_loader(args, urls, hf_opts, tok_path, eos)),
            (FL, fl_loader_case),
            (FLS, fl_streamed_loader_case),
        ]
        for r in range(args.repeats):  # interleaved, rotated: load drifts hit every case
            for name, case in order[r % len(order) :] + order[: r % len(order)]:
                c0 = cpu_now()
                result = case()
                run(name, result, cpu_now() - c0)
        if not loaders:
            fl_loader_case()
        loader = loaders[0]
        for _ in range(args.epoch2_repeats):
            t0 = time.perf_counter()
            n = sum(int(b["input_ids"].numel()) for b in loader)
            run(F2, (time.perf_counter() - t0, n))
        ntok = sum(len(e.ids) + 1 for e in tok.encode_batch(corpus))
        print(f"{args.docs} documents, {ntok / 1e6:.2f} M tokens, {args.files} parquet files, "
              f"{size / 1e6:.1f} MB on {s3.endpoint_url}", flush=True)  # fmt: skip
        rows = {name: row(name, t, max(n)) for name, (t, n) in cases.items()}
        for name, spent in cpu.items():
            rows[name]["cpu_s"] = statistics.median(spent)
            print(f"  CPU s {name:<52} {statistics.median(spent):7.1f}", flush=True)
        for name, spent in firsts.items():
            rows[name]["first_window_s"] = statistics.median(spent)
            print(f"  first window {name:<45} {statistics.median(spent):7.2f} s", flush=True)
        counts = {name: sorted(set(n)) for name, (_, n) in cases.items()}
        print("window tokens per case:", counts, flush=True)

        def ratio(a: str, b: str) -> float:
            return float(rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"])

        ratios = {
            "epoch1_1proc_vs_tokenizer": ratio(F1, T),
            "epoch1_1proc_vs_streaming": ratio(F1, H1),
            "epoch1_loader_vs_tokenizer": ratio(FL, T),
            "epoch1_loader_vs_streaming_loader": ratio(FL, HL),
            "epoch2_loader_vs_streaming_1proc": ratio(F2, H1),
            "epoch2_loader_vs_streaming_loader": ratio(F2, HL),
        }
        ratios["epoch1_1proc_cpu_vs_tokenizer_cpu"] = rows[T]["cpu_s"] / rows[F1]["cpu_s"]
        ratios["epoch1_streamed_vs_streaming"] = ratio(FS, H1)
        ratios["epoch1_streamed_loader_vs_tokenizer"] = ratio(FLS, T)
        ratios["epoch1_streamed_loader_vs_streaming_loader"] = ratio(FLS, HL)
        ratios["epoch1_streamed_loader_vs_loader"] = ratio(FLS, FL)
        ratios["convert_pool_vs_one_batch_loop"] = ratio(CP, CL)
        for key, name in (("streaming", H1), ("fastload", F1), ("fastload_streamed", FS),
                          ("streaming_loader", HL), ("fastload_loader", FL),
                          ("fastload_streamed_loader", FLS)):  # fmt: skip
            ratios[f"first_window_fraction_{key}"] = (
                rows[name]["first_window_s"] / rows[name]["median_s"]
            )
        # seconds, not a ratio: the loader's first batch, streamed and waiting
        ratios["first_batch_s_streamed_loader"] = rows[FLS]["first_window_s"]
        ratios["first_batch_s_loader_waiting"] = rows[FL]["first_window_s"]
        for k, v in ratios.items():
            unit = " s" if k.startswith("first_batch_s_") else "x"
            print(f"  {k:<40} {v:8.2f}{unit}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"env": env, "args": vars(args),
                                                   "rows": list(rows.values()),
                                                   "ratios": ratios}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
