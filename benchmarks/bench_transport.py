"""Batch transport benchmark (issue 9): fastload's cache transport against torch's
DataLoader, webdataset's WebLoader and the store's fetch-and-write bound, one run.

One data set for the whole run: ``--images`` COCO-sized JPEGs (640x480, ~155 KB,
``_epoch_common.make_image_folder``) converted by ``fastload.convert.folder`` into
``--shard-size`` shards on local disk. Every variant runs through a DataLoader with
``--workers`` workers and ``--batch-size``; one untimed warm-up epoch per variant,
then ``--repeats`` timed epochs interleaved round by round (rotating order), each a
fresh loader, so worker start-up is inside the epoch as in training. Sections
(``--only`` runs one):

``warm`` -- raw bytes, shards in a warm ``cache_dir``:
  ``torch_sharded`` (baseline a): ``torch.utils.data.DataLoader(ShardedDataset(...),
  shuffle=True)``; ``wds_local`` (baseline b): ``wds.WebLoader(wds.WebDataset(<the
  shard files>, shardshuffle=<shards>).shuffle(1000).batched(B), batch_size=None)``;
  ``fl_sharded`` / ``fl_stream``: ``fastload.DataLoader`` over ``ShardedDataset``
  (``shuffle=True``) / ``StreamingDataset(shuffle=True)`` with the default (cache)
  transport; ``fl_*_pickle`` the same with ``transport="pickle"`` (context).
``cold`` -- raw bytes from SeaweedFS on 127.0.0.1 (the same shard files uploaded):
  ``fl_sharded_cold`` / ``fl_stream_cold`` with an empty ``cache_dir`` every epoch;
  ``wds_http``: the WebLoader over presigned URLs (s3fs ``fs.url``; webdataset opens
  them with curl); ``bound``: ranged GETs of every shard's bytes (FetchConfig's part
  size, 16 in flight, raw aiobotocore client) ``pwrite``-n into files of a fresh
  directory on the cache's filesystem (no fsync, no checksum: an upper bound).
  Each timed cold epoch follows an untimed one of the same variant (``--no-rehearse``
  to drop it). These machines are VMs with free page reporting: free blocks of 2 MiB
  and up go back to the host within seconds, and the next touch of such a page costs
  ~3-10 us. Every cold epoch frees its predecessor's cache files, so whichever variant
  next allocated large page-cache folios wrote into such memory and spent 0.3-0.6 CPU
  s more on the same bytes (fastload's aligned 1 MiB writes in a third to a half of
  its epochs, worst with a full page cache; with 32 KiB writes fastload was never hit
  and the bound was). So before each timed epoch, untimed: the guest is made to
  report what earlier variants freed (``report_free_pages_now``), then the variant
  runs once; the timed epoch reuses exactly the memory that rehearsal freed, as
  back-to-back epochs of one job do. A pass can still land inside a timed epoch (it
  then took up to 2x the wall and CPU time, whichever the variant): such an epoch is
  set aside and the round's epoch of that variant run again, rehearsal included, at
  most ``--reported-reruns`` times (default 2; every variant alike; the set-aside
  rates are printed; ``--reported-reruns 0`` keeps every epoch).
``decode`` -- 224x224 uint8 images of the first ``--decode-images`` JPEGs (their own
  shards, so a decode epoch stays a few seconds on two cores): ``torch_pil``
  (baseline): torch's DataLoader over the JPEG files, per-sample PIL decode
  (``_epoch_common.plain_decode_tensor``);
  ``fl_default``: ``fastload.DataLoader(ShardedDataset(decode="tensor",
  size=(224, 224)))`` as a user gets it (decoding in the worker processes, batches
  stacked channels-last in shared memory by ``collate_decoded``);
  ``fl_stream_default``: the same with ``StreamingDataset``; ``fl_threads<N>``:
  ``transport="cache", decode_threads=N`` (N = the default thread count), decoding
  in the loader's threads: the other candidate for the default; with
  ``--decode-pil-resize`` also ``fl_pil_resize``: the default with Pillow's resize
  instead of torch's (``Decoder(resizer="pil")``, context). The PIL flavour that ran
  (Pillow or Pillow-SIMD) and whose resize fastload used are printed and in the JSON.
``rss`` -- peak RSS (``VmHWM``) of each worker when the data set grows 10x: random
  139 KB payloads written with ``fastload.ShardWriter`` (``--rss-samples`` and 10x
  that), warm ``cache_dir``, one raw epoch per size and variant in a fresh
  subprocess, workers' ``/proc/<pid>/status`` read after every batch.

Every epoch is checked: each sample's key delivered exactly once (``StreamingDataset``
may repeat up to ``batch x workers`` samples to fill its last batches), so no figure
can come from a loader that drops or repeats samples. Reported: samples/s (median,
[min, max]), samples per CPU second (this process + its reaped workers), the steady
rate (first batch to last, worker start-up excluded) and the ratios to the baselines
(wall, per-round paired, per CPU second); goal lines with met/missed.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_transport.py [--images 2000]
        [--repeats 3] [--workers 2] [--batch-size 64] [--shard-size 32MB]
        [--decode-images 500] [--decode-pil-resize] [--rss-samples 2000]
        [--only warm|cold|decode|rss]
        [--workdir DIR] [--json FILE]

Goal lines use the paired ratio; the steady and per-CPU-second ratios are printed
next to it because on a shared machine they move least.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

import fastload
from _epoch_common import (
    SIZE,
    Epoch,
    batch_images,
    environment,
    interleaved,
    make_image_folder,
    passes_since,
    plain_decode_tensor,
    print_table,
    ratios,
    report_free_pages_now,
    reporting_passes,
    summarize,
    time_epoch,
)
from bench_remote_epoch import load_seaweed
from fastload.decode import Decoder

SCHEMA = "fastload.bench_transport/1"
ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("warm", "cold", "decode", "rss")
RSS_PAYLOAD = 139_000  # bytes per random sample in the rss section
WDS_SHUFFLE = 1000  # webdataset's sample shuffle buffer (per worker)


# --------------------------------------------------------------------- checking
def batch_keys(batch: Any) -> list[str] | None:
    """The sample keys of a batch (None for batches without ``__key__``)."""
    if isinstance(batch, Mapping) and "__key__" in batch:
        return [str(k) for k in batch["__key__"]]
    return None


class Tally:
    """Iterates ``loader`` and notes every batch's keys, the time of the first and
    the last batch, and the first image batch's shape (the checks and the steady
    rate are computed from these after the timed epoch)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.keys: list[str] = []
        self.first: float | None = None
        self.last = 0.0
        self.first_samples = 0
        self.samples = 0
        self.shape: list[int] | None = None

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            now = time.perf_counter()
            if self.first is None:
                self.first, self.first_samples = now, batch_images(batch)
                self.shape = image_shape(batch)
            self.samples += batch_images(batch)
            keys = batch_keys(batch)
            if keys is not None:
                self.keys.extend(keys)
            self.last = now
            yield batch


def image_shape(batch: Any) -> list[int] | None:
    """Shape of a batch's image tensor, if it holds one."""
    value: Any = batch
    if isinstance(batch, Mapping):
        value = batch.get("jpg")
    elif isinstance(batch, (list, tuple)) and batch:
        value = batch[0]
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def tally_facts(t: Tally, expected: set[str] | None) -> dict[str, Any]:
    """What :func:`check_epochs` checks, and the steady rate of one epoch."""
    out: dict[str, Any] = {"shape": t.shape}
    if t.first is not None and t.last > t.first:
        out["steady_per_s"] = (t.samples - t.first_samples) / (t.last - t.first)
    if expected is not None and t.keys:
        seen = set(t.keys)
        out["keys_delivered"] = len(t.keys)
        out["keys_missing"] = len(expected - seen)
        out["keys_unknown"] = len(seen - expected)
        out["keys_repeated"] = len(t.keys) - len(seen)
    return out


def check_epochs(name: str, epochs: list[Epoch], n: int, pad: int, keyed: bool) -> None:
    """Every epoch of ``name`` delivered each of the ``n`` samples once (``pad``:
    repeats allowed to fill the last batches). Raises AssertionError otherwise."""
    for k, e in enumerate(epochs):
        x = e.extra
        if not n <= e.samples < n + max(pad, 1):
            raise AssertionError(f"{name} epoch {k}: {e.samples} samples, the data has {n}")
        if keyed:
            if "keys_missing" not in x:
                raise AssertionError(f"{name} epoch {k}: its batches carry no __key__")
            if x["keys_missing"] or x["keys_unknown"] or x["keys_repeated"] >= max(pad, 1):
                raise AssertionError(f"{name} epoch {k}: bad keys {x}")


def dataset_keys(url: str, **kw: Any) -> set[str]:
    """Every sample key of the data set at ``url`` (from the shard indexes)."""
    ds = fastload.ShardedDataset(url, **kw)
    try:
        return {ds.source.ref(i).key for i in range(len(ds))}
    finally:
        ds.close()


# -------------------------------------------------------------------- baselines
class JpegFiles(torch.utils.data.Dataset[tuple[Any, int]]):
    """Item ``i``: read JPEG file ``paths[i]`` and decode it per sample with PIL."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        with open(self.paths[i], "rb") as f:
            return plain_decode_tensor(f.read()), i


def wds_loader(urls: list[str], bs: int, nw: int) -> Any:
    """webdataset's documented shuffled pipeline over ``urls``, raw samples batched
    in the workers (``batched``), the WebLoader not re-batching."""
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(WDS_SHUFFLE)
        .batched(bs)
    )
    return wds.WebLoader(ds, num_workers=nw, batch_size=None)


def _cpu_seconds() -> float:
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


# ----------------------------------------------------------------- the sections
class Ctx:
    """What the sections share: arguments, paths, the data set and its keys."""

    def __init__(self, args: argparse.Namespace, work: Path, count: int | None = None) -> None:
        self.args = args
        self.work = work
        self.bs, self.nw = args.batch_size, args.workers
        paths = make_image_folder(work / "images", args.images)[: args.images]
        images = work / "images"
        if count is not None and count < len(paths):
            # the first ``count`` images as a folder of their own (hard links)
            images = work / f"images-first-{count}"
            for p in paths[:count]:
                link = images / p.relative_to(work / "images")
                if not link.exists():
                    link.parent.mkdir(parents=True, exist_ok=True)
                    os.link(p, link)
            paths = paths[:count]
        self.paths = paths
        tag = f"{len(paths)}-{args.shard_size}"
        self.shards_dir = work / f"shards-{tag}"
        if not (self.shards_dir / "manifest.json").is_file():
            fastload.convert.folder(
                images,
                str(self.shards_dir),
                shard_size=args.shard_size,
                progress=False,
                overwrite=True,
            )
        self.url = str(self.shards_dir)
        self.manifest = fastload.Manifest.load(self.url)
        self.n = self.manifest.num_samples
        if self.n != len(self.paths):
            raise AssertionError(f"shards hold {self.n} samples, not {len(self.paths)}")
        self.mean_bytes = sum(p.stat().st_size for p in self.paths) / self.n
        self.keys = dataset_keys(self.url, manifest=self.manifest)
        self.cache = work / f"cache-warm-{tag}"
        self._fresh = iter(range(10**9))
        # warm the NVMe cache (and the page cache)
        warm = fastload.ShardedDataset(self.url, cache_dir=self.cache, manifest=self.manifest)
        for s in range(len(self.manifest.shards)):
            warm.source.shard(s)
        warm.close()

    def fresh_dir(self, what: str) -> Path:
        return self.work / f"{what}-{os.getpid()}-{next(self._fresh)}"

    def epoch(
        self,
        make: Callable[[], Any],
        keyed: bool = True,
        after: Callable[[Any], dict[str, Any]] | None = None,
    ) -> Epoch:
        """Time one epoch of the loader ``make()`` builds (wrapped in a Tally)."""

        def probe(t: Tally) -> dict[str, Any]:
            facts = tally_facts(t, self.keys if keyed else None)
            if after is not None:
                facts.update(after(t.loader))
            return facts

        return time_epoch(lambda: Tally(make()), probe)


def close_loader(loader: Any) -> dict[str, Any]:
    """A fastload loader's I/O counters, then close it and its dataset."""
    facts = {k: int(v) for k, v in loader.io_stats().items()}
    facts["transport"] = loader.transport
    loader.close()
    loader.dataset.close()
    return facts


def run_variants(
    ctx: Ctx,
    variants: dict[str, Callable[[], Epoch]],
    pairs: list[tuple[str, str]],
    unkeyed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run ``variants`` interleaved; check every epoch; summaries and the ratios of
    ``pairs`` (candidate, baseline)."""
    epochs = interleaved(variants, ctx.args.repeats)
    results = {name: summarize(e, ctx.mean_bytes) for name, e in epochs.items()}
    for name, r in results.items():
        pad = ctx.bs * ctx.nw if "stream" in name else 0
        check_epochs(name, epochs[name], ctx.n, pad, name not in unkeyed)
        steady = [e.extra["steady_per_s"] for e in epochs[name] if "steady_per_s" in e.extra]
        r["steady_per_s"] = statistics.median(steady) if steady else None
        passes = [
            e.extra["reporting_passes"] for e in epochs[name] if "reporting_passes" in e.extra
        ]
        if passes:  # timed epochs that the VM's free page reporting ran inside
            r["epochs_with_reporting"] = sum(map(bool, passes))
        aside = [x for e in epochs[name] for x in e.extra.get("set_aside_per_s", [])]
        if any("reporting_passes" in e.extra for e in epochs[name]):
            r["set_aside_per_s"] = [round(x, 1) for x in aside]
        for key in ("remote_bytes", "cache_misses", "transport"):
            vals = [e.extra[key] for e in epochs[name] if key in e.extra]
            if vals:
                r[key] = sorted(set(vals))
        r["shape"] = next((e.extra["shape"] for e in epochs[name] if e.extra.get("shape")), None)
    rows: dict[str, Any] = {}
    for cand, base in pairs:
        rows.update(ratios(results, epochs, {cand: base}))
        a, b = results[cand]["steady_per_s"], results[base]["steady_per_s"]
        rows[f"{cand}/{base}"]["steady"] = a / b if a and b else None
    return {"results": results, "ratios": rows}


def goal_lines(rows: Mapping[str, Any], goals: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """One goal line per ``(ratio name, at least)``; met when the paired ratio (the
    median over rounds of the ratio within a round) reaches it."""
    return [
        {
            "ratio": name,
            "need": need,
            "paired": rows[name]["paired"],
            "wall": rows[name]["wall"],
            "met": rows[name]["paired"] >= need,
        }
        for name, need in goals
    ]


def section_warm(ctx: Ctx) -> dict[str, Any]:
    bs, nw, url, cache, m = ctx.bs, ctx.nw, ctx.url, ctx.cache, ctx.manifest
    urls = [str(ctx.shards_dir / s.name) for s in m.shards]

    def torch_sharded() -> Epoch:
        ds = fastload.ShardedDataset(url, cache_dir=cache, manifest=m)
        try:
            return ctx.epoch(
                lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True)
            )
        finally:
            ds.close()

    def fl(kind: str, transport: str, workers: int | None = None) -> Callable[[], Epoch]:
        def run() -> Epoch:
            if kind == "sharded":
                ds: Any = fastload.ShardedDataset(url, cache_dir=cache, manifest=m)
                kw: dict[str, Any] = {"shuffle": True}
            else:
                ds = fastload.StreamingDataset(url, shuffle=True, cache_dir=cache, manifest=m)
                kw = {}
            n = nw if workers is None else workers
            return ctx.epoch(
                lambda: fastload.DataLoader(
                    ds, batch_size=bs, num_workers=n, transport=transport, **kw
                ),
                after=close_loader,
            )

        return run

    variants = {
        "torch_sharded": torch_sharded,
        "wds_local": lambda: ctx.epoch(lambda: wds_loader(urls, bs, nw)),
        "fl_sharded": fl("sharded", "auto"),
        "fl_stream": fl("stream", "auto"),
        "fl_sharded_pickle": fl("sharded", "pickle"),
        "fl_stream_pickle": fl("stream", "pickle"),
        # context: the cache transport needs no worker process for raw batches
        "fl_sharded_0w": fl("sharded", "auto", 0),
    }
    pairs = [
        ("fl_sharded", "torch_sharded"),
        ("fl_stream", "torch_sharded"),
        ("fl_sharded", "wds_local"),
        ("fl_stream", "wds_local"),
        ("fl_sharded_pickle", "torch_sharded"),
        ("fl_stream_pickle", "torch_sharded"),
        ("fl_sharded_pickle", "wds_local"),
        ("fl_stream_pickle", "wds_local"),
        ("wds_local", "torch_sharded"),
        ("fl_sharded_0w", "torch_sharded"),
        ("fl_sharded_0w", "wds_local"),
    ]
    out = run_variants(ctx, variants, pairs)
    out["goals"] = goal_lines(out["ratios"], [(f"{c}/{b}", 3.0) for c, b in pairs[:4]])
    return out


def section_cold(ctx: Ctx) -> dict[str, Any]:
    server = load_seaweed().SeaweedServer(ctx.work / "weed").start()
    try:
        return _cold(ctx, server)
    finally:
        server.stop()
        shutil.rmtree(ctx.work / "weed", ignore_errors=True)


def _cold(ctx: Ctx, server: Any) -> dict[str, Any]:
    import s3fs
    from fsspec.asyn import sync

    from fastload.config import FetchConfig
    from fastload.storage.backends import make_s3_filesystem
    from fastload.storage.url import resolve_s3

    bs, nw = ctx.bs, ctx.nw
    bucket = server.new_bucket()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.s3fs_options())
    names = sorted(p.name for p in ctx.shards_dir.iterdir() if p.is_file())
    fs.put([str(ctx.shards_dir / n) for n in names], [f"{bucket}/shards/{n}" for n in names])
    url, opts = f"s3://{bucket}/shards", server.storage_options
    m = fastload.Manifest.load(url, storage_options=opts)
    total = sum(s.bytes for s in m.shards)
    for s in m.shards:
        if fs.size(f"{bucket}/shards/{s.name}") != s.bytes:
            raise AssertionError(f"uploaded {s.name} has the wrong size")
    presigned = [fs.url(f"{bucket}/shards/{s.name}", expires=24 * 3600) for s in m.shards]

    fetch = FetchConfig()
    settings = resolve_s3(url, opts)
    bfs = make_s3_filesystem(settings, fetch.retry, pool=64)
    part, in_flight = fetch.part_size, 16
    jobs = [(s.name, a, min(a + part, s.bytes)) for s in m.shards for a in range(0, s.bytes, part)]

    async def fetch_all(dest: Path) -> int:
        client = await bfs.set_session()
        sem = asyncio.Semaphore(in_flight)
        fds = {s.name: os.open(dest / s.name, os.O_RDWR | os.O_CREAT, 0o600) for s in m.shards}

        async def one(name: str, start: int, end: int) -> int:
            async with sem:
                resp = await client.get_object(
                    Bucket=settings.bucket,
                    Key=f"{settings.prefix.strip('/')}/{name}",
                    Range=f"bytes={start}-{end - 1}",
                )
                body, pos = resp["Body"], start
                while chunk := await body.read(1 << 20):
                    os.pwrite(fds[name], chunk, pos)
                    pos += len(chunk)
                body.close()
                return pos - start

        try:
            return sum(await asyncio.gather(*(one(*j) for j in jobs)))
        finally:
            for fd in fds.values():
                os.close(fd)

    def bound() -> Epoch:
        os.sync()
        dest = ctx.fresh_dir("bound")
        passes = reporting_passes()
        t0, c0 = time.perf_counter(), _cpu_seconds()
        dest.mkdir()
        got = int(sync(bfs.loop, fetch_all, dest))
        wall, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
        extra: dict[str, Any] = {"remote_bytes": got, **passes_since(passes)}
        shutil.rmtree(dest)
        if got != total:
            raise AssertionError(f"bound fetched {got} bytes, the shards hold {total}")
        return Epoch(ctx.n, total, wall, cpu, extra)

    def fl_cold(kind: str) -> Callable[[], Epoch]:
        def run() -> Epoch:
            os.sync()
            cache = ctx.fresh_dir("cache-cold")
            streams = ctx.args.cold_streams
            fetch_kw = {} if streams is None else {"fetch": FetchConfig(streams=streams)}
            if kind == "sharded":
                ds: Any = fastload.ShardedDataset(
                    url, cache_dir=cache, storage_options=opts, manifest=m, **fetch_kw
                )
                kw: dict[str, Any] = {"shuffle": True}
            else:
                ds = fastload.StreamingDataset(
                    url, shuffle=True, cache_dir=cache, storage_options=opts, manifest=m,
                    **fetch_kw,
                )  # fmt: skip
                kw = {}
            try:
                return ctx.epoch(
                    lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw, **kw),
                    after=close_loader,
                )
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        return run

    def wds_http() -> Epoch:
        os.sync()
        return ctx.epoch(lambda: wds_loader(presigned, bs, nw))

    def rehearsed(run: Callable[[], Epoch]) -> Callable[[], Epoch]:
        """Untimed: the guest's free page reporting run now, then the variant's epoch
        once; then the timed one, which writes its page cache into the memory the
        rehearsal just freed, whatever ran before (see the module's docstring). A timed
        epoch that a reporting pass still ran inside is run again, the same way, up to
        ``--reported-reruns`` times, for every variant alike; the rates of the epochs
        set aside stay in the facts (``set_aside_per_s``) and the report counts them."""

        def twice() -> Epoch:
            set_aside: list[float] = []
            while True:
                if ctx.args.rehearse:
                    report_free_pages_now()
                    run()
                e = run()
                hit = bool(e.extra.get("reporting_passes"))
                if not hit or len(set_aside) >= ctx.args.reported_reruns:
                    break
                set_aside.append(e.samples / e.wall_s)
            if set_aside:
                e.extra["set_aside_per_s"] = set_aside
            return e

        return twice

    variants = {
        "bound": rehearsed(bound),
        "wds_http": rehearsed(wds_http),
        "fl_sharded_cold": rehearsed(fl_cold("sharded")),
        "fl_stream_cold": rehearsed(fl_cold("stream")),
    }
    pairs = [
        ("fl_sharded_cold", "wds_http"),
        ("fl_stream_cold", "wds_http"),
        ("fl_sharded_cold", "bound"),
        ("fl_stream_cold", "bound"),
        ("wds_http", "bound"),
    ]
    out = run_variants(ctx, variants, pairs, unkeyed=("bound",))
    goals = [(f"{c}/{b}", 2.0 if b == "wds_http" else 0.8) for c, b in pairs[:4]]
    out["goals"] = goal_lines(out["ratios"], goals)
    out["dataset_bytes"] = total
    out["bound_request"] = {"part_size": part, "in_flight": in_flight, "requests": len(jobs)}
    out["fastload_streams"] = ctx.args.cold_streams or FetchConfig().streams
    out["rehearsed"] = ctx.args.rehearse
    out["reported_reruns"] = ctx.args.reported_reruns
    out["server"] = " ".join(server.command())
    return out


def section_decode(full: Ctx) -> dict[str, Any]:
    ctx = Ctx(full.args, full.work, full.args.decode_images)
    bs, nw, url, cache, m = ctx.bs, ctx.nw, ctx.url, ctx.cache, ctx.manifest
    # the loader's documented default: one decode thread per CPU core, at most 8
    default_threads = max(1, min(os.cpu_count() or 1, 8))

    def torch_pil() -> Epoch:
        ds = JpegFiles(ctx.paths)
        return ctx.epoch(
            lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=nw, shuffle=True),
            keyed=False,
        )

    def fl(
        kind: str, transport: str, threads: int | None, resizer: str = "auto"
    ) -> Callable[[], Epoch]:
        def run() -> Epoch:
            dec: dict[str, Any] = {"decode": "tensor", "size": SIZE}
            if resizer != "auto":  # what decode="tensor" makes, with another resizer
                dec = {
                    "decode": Decoder(image="tensor", size=SIZE, resize="exact", resizer=resizer)
                }
            if kind == "sharded":
                ds: Any = fastload.ShardedDataset(url, cache_dir=cache, manifest=m, **dec)
                kw: dict[str, Any] = {"shuffle": True}
            else:
                ds = fastload.StreamingDataset(
                    url, shuffle=True, cache_dir=cache, manifest=m, **dec
                )
                kw = {}
            return ctx.epoch(
                lambda: fastload.DataLoader(
                    ds,
                    batch_size=bs,
                    num_workers=nw,
                    transport=transport,
                    decode_threads=threads,
                    **kw,
                ),
                after=close_loader,
            )

        return run

    # fl_default / fl_stream_default: the loader's default (decoding in the worker
    # processes, collate_decoded); fl_threads: transport="cache", decoding on the
    # loader's threads (the other candidate)
    variants: dict[str, Callable[[], Epoch]] = {"torch_pil": torch_pil}
    variants["fl_default"] = fl("sharded", "auto", None)
    variants["fl_stream_default"] = fl("stream", "auto", None)
    variants[f"fl_threads{default_threads}"] = fl("sharded", "cache", default_threads)
    if full.args.decode_pil_resize:
        # context: the default with Pillow's resize instead of torch's (how it was)
        variants["fl_pil_resize"] = fl("sharded", "auto", None, resizer="pil")
    default_name = "fl_default"
    threads_name = f"fl_threads{default_threads}"
    pairs = [(name, "torch_pil") for name in variants if name != "torch_pil"]
    pairs.append((threads_name, "fl_default"))
    if "fl_pil_resize" in variants:
        pairs.append(("fl_default", "fl_pil_resize"))
    out = run_variants(ctx, variants, pairs, unkeyed=("torch_pil",))
    out["goals"] = goal_lines(
        out["ratios"], [(f"{default_name}/torch_pil", 1.5), ("fl_stream_default/torch_pil", 1.5)]
    )
    for name, r in out["results"].items():
        if r["shape"] != [bs, 3, SIZE[0], SIZE[1]]:
            raise AssertionError(f"{name} gave image batches of shape {r['shape']}")
    tvp = out["ratios"][f"{threads_name}/fl_default"]
    out["default_threads"] = default_threads
    out["image_backend"] = image_backend()
    out["images"] = ctx.n
    out["winner"] = {
        "threads_over_processes_paired": tvp["paired"],
        "threads_over_processes_cpu": tvp["cpu"],
        "faster": "threads (cache transport)" if tvp["paired"] >= 1 else "worker processes",
    }
    return out


def image_backend() -> dict[str, Any]:
    """Which PIL ran (Pillow or Pillow-SIMD, its libjpeg) and whose resize fastload's
    ``decode="tensor"`` used for these images (torch's kernels or Pillow's)."""
    from fastload.decode import backend_info
    from fastload.decode.image import _pillow_simd, _torch_kernel

    info = backend_info()
    dec = Decoder(image="tensor", size=SIZE, resize="exact")  # what decode="tensor" makes
    # resizer "auto": torch's bilinear (Pillow filter 2) unless Pillow-SIMD is in use
    wants_torch = dec.resizer == "torch" or (dec.resizer == "auto" and not _pillow_simd())
    torch_resizes = wants_torch and _torch_kernel(2) is not None
    info["fastload_resizer"] = "torch" if torch_resizes else "pil"
    info["torch"] = torch.__version__
    return info


# ---------------------------------------------------------------- rss section
def write_random_shards(root: Path, n: int, shard_size: str) -> str:
    """``n`` samples of :data:`RSS_PAYLOAD` random bytes (field ``bin``) as shards
    under ``root`` (kept if already there); returns the URL."""
    url = str(root)
    if (root / "manifest.json").is_file() and fastload.Manifest.load(url).num_samples == n:
        return url
    rng = np.random.default_rng(n)
    with fastload.ShardWriter(url, shard_size=shard_size, overwrite=True) as w:
        for i in range(n):
            w.write({"__key__": f"{i:08d}", "bin": rng.bytes(RSS_PAYLOAD)})
    return url


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of ``pid`` in bytes ({} if gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def note_worker(pid_dir: str, worker_id: int) -> None:
    """``worker_init_fn``: leave this worker's pid where the main process looks."""
    Path(pid_dir, f"{worker_id}-{os.getpid()}").touch()


def rss_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One raw epoch (in this fresh process) reading the workers' memory after every
    batch; returns their peaks and this process's."""
    pid_dir = tempfile.mkdtemp(prefix="fl-rss-pids-")
    url, cache = spec["url"], spec["cache"]
    if spec["kind"] == "sharded":
        ds: Any = fastload.ShardedDataset(url, cache_dir=cache)
        kw: dict[str, Any] = {"shuffle": True}
    else:
        ds = fastload.StreamingDataset(url, shuffle=True, cache_dir=cache)
        kw = {}
    loader = fastload.DataLoader(
        ds,
        batch_size=spec["batch_size"],
        num_workers=spec["workers"],
        transport=spec["transport"],
        plan_in_workers=True,  # measure worker processes (raw batches start none else)
        worker_init_fn=functools.partial(note_worker, pid_dir),
        **kw,
    )
    before = proc_status(os.getpid())
    peak: dict[int, dict[str, int]] = {}
    keys: set[str] = set()
    delivered = 0
    t0 = time.perf_counter()
    for batch in loader:
        delivered += batch_images(batch)
        keys.update(batch["__key__"])
        for name in os.listdir(pid_dir):
            pid = int(name.split("-")[1])
            st = proc_status(pid)
            if st:
                mine = peak.setdefault(pid, {})
                for k, v in st.items():
                    mine[k] = max(mine.get(k, 0), v)
    wall = time.perf_counter() - t0
    transport = loader.transport
    loader.close()
    ds.close()
    shutil.rmtree(pid_dir, ignore_errors=True)
    return {
        "delivered": delivered,
        "unique_keys": len(keys),
        "wall_s": wall,
        "transport": transport,
        "main_rss_before": before.get("VmRSS", 0),
        "main_peak": proc_status(os.getpid()).get("VmHWM", 0),
        "main_end": proc_status(os.getpid()),
        "workers": [peak[p] for p in sorted(peak)],
    }


def section_rss(ctx: Ctx) -> dict[str, Any]:
    args = ctx.args
    sizes = (args.rss_samples, 10 * args.rss_samples)
    data: dict[int, tuple[str, str]] = {}
    for n in sizes:
        t0 = time.perf_counter()
        url = write_random_shards(ctx.work / f"rss-{n}" / "shards", n, args.shard_size)
        cache = str(ctx.work / f"rss-{n}" / "cache")
        ds = fastload.ShardedDataset(url, cache_dir=cache)
        for s in range(len(ds.manifest.shards)):  # warm the cache (in this process)
            ds.source.index(s)
            ds.source.shard(s)
        ds.close()
        data[n] = (url, cache)
        print(f"  rss data {n} samples ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    variants = [("fl_sharded", "sharded", "auto"), ("fl_stream", "stream", "auto")]
    variants.append(("fl_sharded_pickle", "sharded", "pickle"))
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for name, kind, transport in variants:
        for n in sizes:
            url, cache = data[n]
            spec = {
                "url": url,
                "cache": cache,
                "kind": kind,
                "transport": transport,
                "workers": ctx.nw,
                "batch_size": ctx.bs,
            }
            proc = subprocess.run(
                [sys.executable, __file__, "--rss-child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"rss child {name} {n} failed:\n{proc.stderr[-4000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            pad = ctx.bs * ctx.nw if kind == "stream" else 1
            if r["unique_keys"] != n or not n <= r["delivered"] < n + pad:
                raise AssertionError(f"rss {name} {n}: {r['unique_keys']} keys, {r['delivered']}")
            if len(r["workers"]) != ctx.nw:
                raise AssertionError(f"rss {name} {n}: saw {len(r['workers'])} workers")
            r["worker_peak_max"] = max(w["VmHWM"] for w in r["workers"])
            runs.setdefault(name, {})[n] = r
            print(
                f"  rss {name:<18} {n:>7} samples: worker peak "
                f"{r['worker_peak_max'] / 2**20:7.1f} MiB, main peak "
                f"{r['main_peak'] / 2**20:7.1f} MiB ({r['wall_s']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    lo, hi = sizes
    rows = {}
    for name, per in runs.items():
        ratio = per[hi]["worker_peak_max"] / per[lo]["worker_peak_max"]
        rows[name] = {"small": per[lo], "large": per[hi], "ratio": ratio}
    goals = [
        {
            "ratio": f"{name} worker peak RSS {hi}/{lo}",
            "need": "0.9..1.1",
            "paired": rows[name]["ratio"],
            "wall": rows[name]["ratio"],
            "met": 0.9 <= rows[name]["ratio"] <= 1.1,
        }
        for name in ("fl_sharded", "fl_stream")
    ]
    return {"sizes": list(sizes), "payload_bytes": RSS_PAYLOAD, "runs": rows, "goals": goals}


# ------------------------------------------------------------------------ main
def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fl-transport-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ctx = Ctx(args, work)
    setup_s = time.perf_counter() - t0
    sections = [args.only] if args.only else list(SECTIONS)
    print(
        f"{ctx.n} JPEGs (~{ctx.mean_bytes / 1000:.0f} KB) in {len(ctx.manifest.shards)} shards; "
        f"sections {sections}; {args.repeats} interleaved rounds",
        file=sys.stderr,
    )
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "images": ctx.n,
        "mean_jpeg_bytes": ctx.mean_bytes,
        "dataset_bytes": ctx.manifest.total_bytes,
        "shards": len(ctx.manifest.shards),
        "shard_size": args.shard_size,
        "workers": ctx.nw,
        "batch_size": ctx.bs,
        "repeats": args.repeats,
        "setup_s": round(setup_s, 1),
        "sections": {},
    }
    fns = {"warm": section_warm, "cold": section_cold, "decode": section_decode}
    fns["rss"] = section_rss
    for name in sections:
        print(f"section {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        doc["sections"][name] = fns[name](ctx)
        doc["sections"][name]["section_s"] = round(time.perf_counter() - t0, 1)
    doc["environment"] = environment(ctx.cache)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return doc


def print_doc(doc: dict[str, Any]) -> None:
    print(
        f"{doc['images']} JPEGs 640x480 ~{doc['mean_jpeg_bytes'] / 1000:.0f} KB in "
        f"{doc['shards']} shards of {doc['shard_size']}; {doc['workers']} workers, batch "
        f"{doc['batch_size']}; median [min, max] of {doc['repeats']} interleaved epochs; "
        f"load avg {doc['environment']['loadavg'][0]:.1f}"
    )
    for name, sec in doc["sections"].items():
        images = f", {sec['images']} images" if "images" in sec else ""
        print(f"\n== {name} ({sec['section_s']} s{images})")
        if "results" in sec:
            print_table(sec["results"], sec["ratios"])
            for v, r in sec["results"].items():
                extra = f"steady {r['steady_per_s']:.0f}/s" if r["steady_per_s"] else ""
                if "remote_bytes" in r:
                    extra += f", fetched {r['remote_bytes']} B per epoch"
                if "transport" in r:
                    extra += f", transport {r['transport']}"
                print(f"  {v:<22} {extra}")
            for k, r in sec["ratios"].items():
                if r.get("steady"):
                    print(f"  steady ratio {k:<38} {r['steady']:.2f}x")
        if name == "cold":
            print(
                f"  dataset {sec['dataset_bytes']} B; bound {sec['bound_request']}; "
                f"fastload streams {sec.get('fastload_streams')}"
            )
            for v, r in sec["results"].items():
                if r.get("remote_bytes") and v != "bound":
                    got = max(r["remote_bytes"]) / sec["dataset_bytes"]
                    print(f"  {v:<22} fetched {got:.4f}x the shards' bytes per epoch")
            how = "after a rehearsal" if sec.get("rehearsed") else "no rehearsal"
            counts = {
                v: r["epochs_with_reporting"]
                for v, r in sec["results"].items()
                if "epochs_with_reporting" in r
            }
            if counts:
                print(
                    f"  free page reporting ({how}): timed epochs it ran inside "
                    + ", ".join(f"{v} {k}/{doc['repeats']}" for v, k in counts.items())
                )
                aside = {
                    v: r["set_aside_per_s"]
                    for v, r in sec["results"].items()
                    if "set_aside_per_s" in r
                }
                print(
                    f"  epochs set aside and run again because a pass ran inside them "
                    f"(at most {sec.get('reported_reruns')} per round): "
                    + ", ".join(
                        f"{v} {len(x)}" + (f" ({', '.join(f'{y:.0f}' for y in x)}/s)" if x else "")
                        for v, x in aside.items()
                    )
                )
        if name == "decode":
            ib = sec["image_backend"]
            print(
                f"  PIL: {ib['library']} {ib['version']} (libjpeg-turbo "
                f"{ib['libjpeg_turbo_version']}); fastload resizes with "
                f"{ib['fastload_resizer']} (torch {ib['torch']})"
            )
            w = sec["winner"]
            print(
                f"  decode winner: {w['faster']} (threads/processes paired "
                f"{w['threads_over_processes_paired']:.2f}x, per CPU s "
                f"{w['threads_over_processes_cpu']:.2f}x; default threads "
                f"{sec['default_threads']})"
            )
        if name == "rss":
            for v, r in sec["runs"].items():
                small, large = r["small"], r["large"]
                print(
                    f"  {v:<18} worker peak RSS {small['worker_peak_max'] / 2**20:.1f} MiB "
                    f"-> {large['worker_peak_max'] / 2**20:.1f} MiB ({r['ratio']:.3f}x); "
                    f"main peak {small['main_peak'] / 2**20:.0f} -> "
                    f"{large['main_peak'] / 2**20:.0f} MiB (at the end: anon "
                    f"{large['main_end'].get('RssAnon', 0) / 2**20:.0f}, file "
                    f"{large['main_end'].get('RssFile', 0) / 2**20:.0f} MiB)"
                )
    print("\ngoals:")
    for name, sec in doc["sections"].items():
        for g in sec.get("goals", []):
            need = g["need"] if isinstance(g["need"], str) else f">= {g['need']}x"
            print(
                f"  [{'met' if g['met'] else 'MISSED'}] {name}: {g['ratio']} {need}: "
                f"paired {g['paired']:.2f}x (wall {g['wall']:.2f}x)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--images", type=int, default=2000, help="number of JPEGs")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per variant")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", default="32MB", help="target shard size")
    parser.add_argument(
        "--decode-images", type=int, default=500, help="decode: the first N of the images"
    )
    parser.add_argument(
        "--decode-pil-resize",
        action="store_true",
        help="decode: also fl_pil_resize, the default with Pillow's resize (context)",
    )
    parser.add_argument("--rss-samples", type=int, default=2000, help="rss: small size (x10)")
    parser.add_argument(
        "--no-rehearse",
        dest="rehearse",
        action="store_false",
        help="cold: time each epoch without an untimed one of the same variant just before",
    )
    parser.add_argument(
        "--reported-reruns",
        type=int,
        default=2,
        help="cold: run a timed epoch again (at most N times per round, every variant "
        "alike) when the VM's free page reporting ran inside it; 0 keeps every epoch",
    )
    parser.add_argument(
        "--cold-streams",
        type=int,
        default=None,
        help="cold: FetchConfig(streams=N) for fastload's variants (default: the default, 16)",
    )
    parser.add_argument("--only", choices=SECTIONS, default=None, help="run one section")
    parser.add_argument("--workdir", default=None, help="keep/reuse images, shards here")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the results here")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        print(json.dumps(rss_child(json.loads(args.rss_child))))
        return 0
    doc = run(args)
    print_doc(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
