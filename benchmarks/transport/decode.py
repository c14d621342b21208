"""Section ``decode``: 224x224 uint8 images of the first ``--decode-images`` JPEGs;
fastload's default decoding (in the workers) and its threads against torch's
DataLoader with per-sample PIL decode, and which PIL and resize ran."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch.utils.data

import fastload
from _epoch_common import SIZE, Epoch
from _jpeg_files import JpegFiles
from fastload.decode import Decoder
from transport.data import Ctx
from transport.epochs import close_loader, goal_lines, run_variants


def section_decode(full: Ctx) -> dict[str, Any]:
    """The decode variants over the first ``--decode-images`` images (their own
    shards): results, ratios, goal lines (>= 1.5x), the PIL that ran and the winner
    of threads against processes."""
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
    before = one_thread(ctx.paths)
    out = run_variants(ctx, variants, pairs, unkeyed=("torch_pil",))
    out["goals"] = goal_lines(
        out["ratios"], [(f"{default_name}/torch_pil", 1.5), ("fl_stream_default/torch_pil", 1.5)]
    )
    for name, r in out["results"].items():
        if r["shape"] != [bs, 3, SIZE[0], SIZE[1]]:
            raise AssertionError(f"{name} gave image batches of shape {r['shape']}")
    after = one_thread(ctx.paths)
    cores = min(nw, os.cpu_count() or 1) if nw else min(default_threads, os.cpu_count() or 1)
    out["bound"] = bound_line(out["results"], before, after, cores=cores)
    ceiling = independent(ctx.paths, cores)
    out["bound"]["independent"] = ceiling
    out["bound"]["independent_efficiency"] = ceiling["per_cpu_s"] / out["bound"][
        "one_thread_per_cpu_s"
    ]
    out["bound"]["independent_of_bound"] = ceiling["per_s"] / out["bound"]["bound_per_s"]
    if nw:
        out["goals"].append(
            {
                "ratio": "fl_default/bound (per CPU second)",
                "need": 0.9,
                "paired": out["bound"]["variants"]["fl_default"]["efficiency"],
                "wall": out["bound"]["variants"]["fl_default"]["of_bound"],
                "met": out["bound"]["variants"]["fl_default"]["efficiency"] >= 0.9,
            }
        )
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


def one_thread(paths: list[Any], passes: int = 2) -> dict[str, float]:
    """One thread's rate of the loader's work (the same JPEGs from memory: draft
    decode, resize to 224x224, uint8 tensor; what ``decode="tensor", size=224``
    makes), torch's intra-op threads at 1 as in a worker: the best of ``passes``
    passes, img/s by the wall clock and per CPU second of the thread."""
    data = [p.read_bytes() for p in paths]
    dec = Decoder(image="tensor", size=SIZE, resize="exact")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    walls, cpus = [], []
    try:
        for k, blob in enumerate(data[:8]):  # warm-up
            dec({"__key__": str(k), "jpg": blob})
        for _ in range(passes):
            t0, c0 = time.perf_counter(), time.thread_time()
            for k, blob in enumerate(data):
                dec({"__key__": str(k), "jpg": blob})
            walls.append(len(data) / (time.perf_counter() - t0))
            cpus.append(len(data) / max(time.thread_time() - c0, 1e-9))
    finally:
        torch.set_num_threads(threads)
    return {"per_s": max(walls), "per_cpu_s": max(cpus)}


def _decode_part(blobs: list[bytes], queue: Any) -> None:
    torch.set_num_threads(1)
    dec = Decoder(image="tensor", size=SIZE, resize="exact")
    c0 = time.thread_time()
    for k, blob in enumerate(blobs):
        dec({"__key__": str(k), "jpg": blob})
    queue.put(time.thread_time() - c0)


def independent(paths: list[Any], cores: int) -> dict[str, float]:
    """The machine's own ceiling for parallel decode: ``cores`` forked processes, each
    decoding its share of the images from memory with no loader at all (no batches,
    no transport): img/s by the wall clock and per CPU second of their loops."""
    import multiprocessing

    data = [p.read_bytes() for p in paths]
    mp = multiprocessing.get_context("fork")
    queue = mp.SimpleQueue()
    procs = [mp.Process(target=_decode_part, args=(data[k::cores], queue)) for k in range(cores)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    cpu = sum(queue.get() for _ in procs)
    return {"per_s": len(data) / wall, "per_cpu_s": len(data) / max(cpu, 1e-9)}


def bound_line(
    results: dict[str, Any], before: dict[str, float], after: dict[str, float], cores: int
) -> dict[str, Any]:
    """The bound: one thread's rate of the same work (the median of the runs before
    and after the variants) x the cores the loader uses; each variant's wall rate
    over it (``of_bound``, ``steady_of_bound``: its rate after the first batch) and
    its efficiency (its images per CPU second, workers and main process together,
    over one thread's)."""
    per_s = statistics.median([before["per_s"], after["per_s"]])
    per_cpu = statistics.median([before["per_cpu_s"], after["per_cpu_s"]])
    cores = max(1, cores)
    rows: dict[str, Any] = {}
    for name, r in results.items():
        steady = r.get("steady_per_s")
        rows[name] = {
            "of_bound": r["samples_per_s"] / (per_s * cores),
            "steady_of_bound": steady / (per_s * cores) if steady else None,
            "efficiency": (r["samples_per_cpu_s"] or 0.0) / per_cpu,
        }
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "one_thread_per_s": per_s,
        "one_thread_per_cpu_s": per_cpu,
        "one_thread_runs": [before, after],
        "cores": cores,
        "bound_per_s": per_s * cores,
        "load_average": load,
        "variants": rows,
    }


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
