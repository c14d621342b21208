"""Section ``cold``: raw bytes from a local SeaweedFS (:class:`fastload.bench.LocalS3`)
with an empty ``cache_dir`` every epoch, against webdataset over presigned URLs and
the store's fetch-and-write bound; each timed epoch after an untimed rehearsal
(the VM's free page reporting: see the package's docstring)."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastload
from _epoch_common import Epoch, passes_since, report_free_pages_now, reporting_passes
from _ranged_get import ranged_gets
from fastload.bench import LocalS3
from transport.data import Ctx
from transport.epochs import close_loader, goal_lines, run_variants
from transport.warm import wds_loader

#: Issue 25's line for a cold epoch: client CPU seconds per GB fetched, at most.
CPU_S_PER_GB_GOAL = 1.5


def _cpu_seconds() -> float:
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (of any of its threads)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                kids += [
                    int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                ]
    return kids


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of live process ``pid``, of its reaped children and of its live
    descendants (from ``/proc``; 0 for a process that has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[11:15]: utime, stime, cutime, cstime (stat(5) fields 14-17)
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK") + sum(_tree_cpu_seconds(k) for k in _children(pid))


def live_workers_cpu(before: set[int]) -> float:
    """CPU seconds of this process's live children started since ``before`` was taken
    (with their descendants): worker processes a loader keeps until it is closed,
    which ``RUSAGE_CHILDREN`` counts only once they are reaped."""
    return sum(_tree_cpu_seconds(k) for k in _children(os.getpid()) if k not in before)


def section_cold(ctx: Ctx) -> dict[str, Any]:
    """Start a local SeaweedFS, upload the shards, run the cold variants; stop it."""
    server = LocalS3(ctx.work / "weed").start()
    try:
        return _cold(ctx, server)
    finally:
        server.stop()
        shutil.rmtree(ctx.work / "weed", ignore_errors=True)


def _cold(ctx: Ctx, server: LocalS3) -> dict[str, Any]:
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

    prefix = settings.prefix.strip("/")
    keyed = [(f"{prefix}/{name}", start, end) for name, start, end in jobs]

    async def fetch_all(dest: Path) -> int:
        client = await bfs.set_session()
        fds = {
            f"{prefix}/{s.name}": os.open(dest / s.name, os.O_RDWR | os.O_CREAT, 0o600)
            for s in m.shards
        }

        def write(key: str, chunk: bytes, pos: int) -> None:
            os.pwrite(fds[key], chunk, pos)

        try:
            return await ranged_gets(client, settings.bucket, keyed, in_flight, write)
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
            before = set(_children(os.getpid()))  # the SeaweedFS server among them

            def after(loader: Any) -> dict[str, Any]:
                # the loader's workers are alive until it closes (after the clock
                # stopped): their CPU is read from /proc before closing it
                return {"live_workers_cpu_s": live_workers_cpu(before), **close_loader(loader)}

            try:
                e = ctx.epoch(
                    lambda: fastload.DataLoader(ds, batch_size=bs, num_workers=nw, **kw),
                    after=after,
                )
                e.cpu_s += e.extra["live_workers_cpu_s"]
                return e
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
    # CPU seconds of the client's whole process tree (this process and its reaped
    # workers; the SeaweedFS server is a child reaped only when the section ends, so
    # its CPU is not in it) per GB of the shards, the median over the timed epochs
    out["cpu_s_per_gb"] = {
        name: statistics.median(r["cpu_s"]) / (total / 1e9) for name, r in out["results"].items()
    }
    out["goals"] += [
        {
            "ratio": f"{name} client CPU-s/GB",
            "need": f"<= {CPU_S_PER_GB_GOAL}",
            "paired": out["cpu_s_per_gb"][name],
            "wall": out["cpu_s_per_gb"][name],
            "met": out["cpu_s_per_gb"][name] <= CPU_S_PER_GB_GOAL,
        }
        for name in ("fl_sharded_cold", "fl_stream_cold")
    ]
    out["bound_request"] = {"part_size": part, "in_flight": in_flight, "requests": len(jobs)}
    out["fastload_streams"] = ctx.args.cold_streams or FetchConfig().streams
    out["rehearsed"] = ctx.args.rehearse
    out["reported_reruns"] = ctx.args.reported_reruns
    out["server"] = " ".join(server.command())
    return out
