"""Section ``decode``: 224x224 uint8 images of the first ``--decode-images`` JPEGs;
fastload's default decoding (in the workers) and its threads against torch's
DataLoader with per-sample PIL decode, and which PIL and resize ran."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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
        kind: str, transport: str, threads: int | None, resizer: str = "auto", recycle: bool = True
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
                    recycle_batches=recycle,
                    **kw,
                ),
                after=close_loader,
            )

        return run

    # fl_default / fl_stream_default: the loader's default (decoding in the worker
    # processes, collate_decoded, each worker's batch slabs recycled); fl_threads:
    # transport="cache", decoding on the loader's threads (the other candidate)
    variants: dict[str, Callable[[], Epoch]] = {"torch_pil": torch_pil}
    variants["fl_default"] = fl("sharded", "auto", None)
    variants["fl_stream_default"] = fl("stream", "auto", None)
    variants[f"fl_threads{default_threads}"] = fl("sharded", "cache", default_threads)
    # context: the default with a fresh shared-memory segment per batch (how it was)
    variants["fl_fresh_batches"] = fl("sharded", "auto", None, recycle=False)
    if full.args.decode_pil_resize:
        # context: the default with Pillow's resize instead of torch's (how it was)
        variants["fl_pil_resize"] = fl("sharded", "auto", None, resizer="pil")
    default_name = "fl_default"
    threads_name = f"fl_threads{default_threads}"
    pairs = [(name, "torch_pil") for name in variants if name != "torch_pil"]
    pairs.append((threads_name, "fl_default"))
    pairs.append(("fl_default", "fl_fresh_batches"))
    if "fl_pil_resize" in variants:
        pairs.append(("fl_default", "fl_pil_resize"))
    # the bound's parts, interleaved with the loaders in every round: one thread doing
    # the same work, and ``cores`` processes doing it alone (the machine's ceiling)
    cores = max(1, min(nw or default_threads, os.cpu_count() or 1))
    blobs = [p.read_bytes() for p in ctx.paths]
    variants["one_thread"] = lambda: ctx.epoch(lambda: one_thread(blobs), keyed=False)
    variants[f"alone{cores}"] = lambda: ctx.epoch(lambda: alone(blobs, cores), keyed=False)
    bound_names = ("one_thread", f"alone{cores}")
    pairs += [(name, "one_thread") for name in variants if name != "one_thread"]
    out = run_variants(ctx, variants, pairs, unkeyed=("torch_pil", *bound_names))
    # 1.5x: issue 9's line; 2x: issue 25's (with the bound's 0.9x below)
    out["goals"] = goal_lines(
        out["ratios"],
        [
            (f"{default_name}/torch_pil", 1.5),
            ("fl_stream_default/torch_pil", 1.5),
            (f"{default_name}/torch_pil", 2.0),
        ],
    )
    for name, r in out["results"].items():
        if name not in bound_names and r["shape"] != [bs, 3, SIZE[0], SIZE[1]]:
            raise AssertionError(f"{name} gave image batches of shape {r['shape']}")
    out["bound"] = bound_line(out, cores)
    if nw:
        row = out["bound"]["variants"]["fl_default"]
        out["goals"].append(
            {
                "ratio": "fl_default/bound (efficiency: per CPU second)",
                "need": 0.9,
                "paired": row["efficiency"],
                "wall": row["of_bound"],
                "met": row["efficiency"] >= 0.9,
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


def one_thread(blobs: list[bytes]) -> Iterator[dict[str, Any]]:
    """One thread doing the loader's work on each image (the same JPEGs, from memory):
    draft decode, resize to 224x224, uint8 tensor, what ``decode="tensor", size=224``
    makes; torch's intra-op threads at 1, as in a worker. One image per item."""
    dec = Decoder(image="tensor", size=SIZE, resize="exact")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for k, blob in enumerate(blobs):
            yield {"jpg": dec({"__key__": str(k), "jpg": blob})["jpg"].unsqueeze(0)}
    finally:
        torch.set_num_threads(threads)


def _decode_part(blobs: list[bytes]) -> None:
    torch.set_num_threads(1)
    dec = Decoder(image="tensor", size=SIZE, resize="exact")
    for k, blob in enumerate(blobs):
        dec({"__key__": str(k), "jpg": blob})


def alone(blobs: list[bytes], cores: int) -> Iterator[dict[str, Any]]:
    """The machine's own ceiling for parallel decode: ``cores`` forked processes, each
    doing :func:`one_thread`'s work on its share of the images, with no loader (no
    batches, no transport). One item counting every image, when all are done."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    procs = [mp.Process(target=_decode_part, args=(blobs[k::cores],)) for k in range(cores)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise AssertionError(f"a decoding process exited with {p.exitcode}")
    yield {"jpg": torch.empty((len(blobs), 0), dtype=torch.uint8)}


def bound_line(out: dict[str, Any], cores: int) -> dict[str, Any]:
    """The bound: one thread's rate of the same work x the cores the loader uses.
    Per variant: ``of_bound`` (its wall rate over the bound, paired within rounds),
    ``steady_of_bound`` (its rate after the first batch over the bound) and
    ``efficiency`` (its images per CPU second, workers and main process together,
    over one thread's)."""
    results, rows = out["results"], out["ratios"]
    one = results["one_thread"]
    bound = one["samples_per_s"] * cores
    variants: dict[str, Any] = {}
    for name, r in results.items():
        if name == "one_thread":
            continue
        row = rows[f"{name}/one_thread"]
        steady = r.get("steady_per_s")
        variants[name] = {
            "of_bound": row["paired"] / cores,
            "steady_of_bound": steady / bound if steady else None,
            "efficiency": row["cpu"],
        }
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "one_thread_per_s": one["samples_per_s"],
        "one_thread_per_cpu_s": one["samples_per_cpu_s"],
        "cores": cores,
        "bound_per_s": bound,
        "load_average": load,
        "variants": variants,
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
