"""The GPU check's measuring sections: host-to-device copies, the loader's device feed,
GPU JPEG decode. Each returns a JSON-ready dict; sub-parts fail on their own (their
``status`` says so) and make the section's status ``"error"``.
"""

from __future__ import annotations

import ctypes
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_data import PreparedImages, RandomBytes, pack_raw

TimeLeft = Callable[[], float]


def part(result: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Run one sub-part into ``result[name]``; an exception is recorded, not raised."""
    t0 = time.monotonic()
    try:
        value = fn()
        out = value if isinstance(value, dict) else {"rows": value}
        out.setdefault("status", "ok")
    except ImportError as exc:  # a missing optional package (MissingDependencyError too)
        out = {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
    except Exception:
        out = {"status": "error", "traceback": traceback.format_exc()}
        result["status"] = "error"
    out["seconds"] = round(time.monotonic() - t0, 2)
    result[name] = out


def _sync(torch: Any, device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


# ------------------------------------------------------------------------- H2D
def _cudart() -> Any:
    """The CUDA runtime torch loaded (found in /proc/self/maps), or None."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            paths = [ln.split()[-1] for ln in f if "libcudart.so" in ln]
    except OSError:
        pass
    for name in [*paths, "libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMemcpy.restype = ctypes.c_int
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return lib
    return None


def _rate(copy: Callable[[], Any], nbytes: int, repeats: int, sync: Callable[[], None]) -> float:
    """GB/s of ``repeats`` calls of ``copy`` moving ``nbytes`` each (after one warm-up)."""
    copy()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        copy()
    sync()
    return nbytes * repeats / (time.perf_counter() - t0) / 1e9


def _h2d_row(torch: Any, device: str, mb: float, repeats: int, cudart: Any) -> dict[str, Any]:
    n = int(mb * 1e6)
    sync = _sync(torch, device)
    dst = torch.empty(n, dtype=torch.uint8, device=device)
    pageable = torch.randint(0, 255, (n,), dtype=torch.uint8)
    row: dict[str, Any] = {"size_mb": mb}
    row["pageable_gb_s"] = _rate(lambda: dst.copy_(pageable), n, repeats, sync)
    if not device.startswith("cuda"):
        return row
    pinned = pageable.pin_memory()
    row["pinned_gb_s"] = _rate(lambda: dst.copy_(pinned, non_blocking=True), n, repeats, sync)
    row["pinned_over_pageable"] = row["pinned_gb_s"] / row["pageable_gb_s"]
    if cudart is None:
        return row
    src_ptr, dst_ptr = pinned.data_ptr(), dst.data_ptr()
    codes: list[int] = []

    def memcpy() -> None:
        codes.append(cudart.cudaMemcpy(dst_ptr, src_ptr, n, 1))  # 1: cudaMemcpyHostToDevice

    ceiling = _rate(memcpy, n, repeats, sync)
    if any(codes):
        row["ceiling_error"] = f"cudaMemcpy returned {sorted(set(codes))}"
    else:
        row["ceiling_gb_s"] = ceiling
        row["pinned_over_ceiling"] = row["pinned_gb_s"] / ceiling
    return row


def h2d_section(
    torch: Any, device: str, sizes_mb: list[float], repeats: int, time_left: TimeLeft
) -> dict[str, Any]:
    """GB/s of pageable and pinned ``copy_`` host-to-device, against the ceiling: plain
    ``cudaMemcpy`` from the same pinned buffer, called through the CUDA runtime torch
    loaded. On the CPU (dry run) only the pageable copy runs."""
    cuda = device.startswith("cuda")
    cudart = _cudart() if cuda else None
    result: dict[str, Any] = {
        "ceiling_method": "cudaMemcpy (ctypes, libcudart)" if cudart else None,
        "repeats": repeats,
    }
    if cuda and cudart is None:
        result["ceiling_note"] = "libcudart not found: no cudaMemcpy ceiling"
    rows = []
    for mb in sizes_mb:
        if time_left() < 10:
            rows.append({"size_mb": mb, "status": "skipped", "reason": "time budget"})
            continue
        rows.append(_h2d_row(torch, device, mb, repeats, cudart))
    result["rows"] = rows
    return result


# ----------------------------------------------------------------- loader feed
def loader_section(
    torch: Any,
    device: str,
    *,
    image_size: int,
    batch_size: int,
    batches: int,
    workers: int,
    prefetch: int,
    time_left: TimeLeft,
) -> dict[str, Any]:
    """Batches/s delivered on ``device`` from ready tensors: torch's DataLoader
    (``pin_memory`` + ``.to(device, non_blocking=True)``, the usual recipe: the baseline)
    vs ``fastload.DataLoader(device=...)`` without workers (its own pinned pool, side
    stream, CUDA events) and with workers (torch's pin thread); and a PackedBytes field
    (one buffer per batch) through the loader's pool. Every delivered batch is checked."""
    import fastload

    cuda = device.startswith("cuda")
    sync = _sync(torch, device)
    ds = PreparedImages(batches * batch_size, image_size)
    expected = [int(t.sum()) for t in ds.images]  # per distinct image
    mb = batch_size * 3 * image_size * image_size / 1e6
    result: dict[str, Any] = {"batch_size": batch_size, "batch_mb": mb, "batches": batches}

    def check(batch: dict[str, Any]) -> None:
        img, label = batch["image"], batch["label"]
        assert img.device.type == torch.device(device).type, img.device
        # the label is the sample index i and the image images[i % 64]: one per batch
        i = int(label[0])
        assert int(img[0].sum()) == expected[i % len(expected)], "wrong pixels delivered"

    def timed(make_iter: Callable[[], Any]) -> dict[str, Any]:
        # the clock starts at the first batch: worker start-up is not the feed rate
        t0 = first = time.perf_counter()
        count = 0
        for batch in make_iter():
            check(batch)
            if count == 0:
                sync()
                t0 = time.perf_counter()
                first = t0 - first
            count += 1
            if time_left() < 8:
                break
        sync()
        timed_batches = count - 1
        rate = timed_batches / max(time.perf_counter() - t0, 1e-9)
        return {
            "batches": timed_batches,
            "first_batch_s": first,
            "batches_s": rate,
            "gb_s": rate * mb / 1e3,
        }

    def common(w: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"batch_size": batch_size, "num_workers": w, "drop_last": True}
        if w:
            kw.update(persistent_workers=False, prefetch_factor=prefetch)
        return kw

    def torch_recipe(w: int) -> Callable[[], Any]:
        def make() -> Any:
            loader = torch.utils.data.DataLoader(ds, pin_memory=cuda, **common(w))
            for b in loader:
                yield {k: v.to(device, non_blocking=cuda) for k, v in b.items()}

        return make

    def ours(w: int) -> Callable[[], Any]:
        def make() -> Any:
            loader = fastload.DataLoader(
                ds, device=device, pin_memory=True, world=fastload.World.single(), **common(w)
            )
            yield from loader
            pool = loader.pool_stats()
            result.setdefault("pools", {})[f"workers_{w}"] = None if pool is None else vars(pool)

        return make

    timed(torch_recipe(0))  # warm-up: CUDA context, allocator, page cache
    for w in sorted({0, workers}):

        def pair(w: int = w) -> dict[str, Any]:
            base, mine = timed(torch_recipe(w)), timed(ours(w))
            return {
                "workers": w,
                "torch": base,
                "fastload": mine,
                "fastload_over_torch": mine["batches_s"] / base["batches_s"],
            }

        part(result, f"workers_{w}", pair)

    def packed() -> dict[str, Any]:
        item = 110_000  # about a COCO JPEG
        raw = RandomBytes(batches * batch_size, item)
        loader = fastload.DataLoader(
            raw,
            batch_size=batch_size,
            collate_fn=pack_raw,
            device=device,
            pin_memory=True,
            world=fastload.World.single(),
        )
        t0 = time.perf_counter()
        count = nbytes = 0
        for b in loader:
            p = b["raw"]
            assert p.data.device.type == torch.device(device).type
            if count == 0:  # the bytes arrive intact, item by item; the clock starts
                want = [raw[int(i)]["raw"] for i in b["label"].cpu()]
                assert p.tolist() == want, "packed bytes differ after the copy"
                sync()
                t0 = time.perf_counter()
            else:
                nbytes += p.nbytes
            count += 1
            if time_left() < 8:
                break
        sync()
        dt = max(time.perf_counter() - t0, 1e-9)
        pool = loader.pool_stats()
        return {
            "item_bytes": item,
            "batches": count - 1,
            "gb_s": nbytes / dt / 1e9,
            "pool": None if pool is None else vars(pool),
        }

    part(result, "packed_bytes", packed)
    return result


# ---------------------------------------------------------------------- decode
def decode_section(
    torch: Any,
    device: str,
    blobs: list[bytes],
    *,
    batch_sizes: list[int],
    iters: int,
    size: int,
    tmpdir: str,
    time_left: TimeLeft,
) -> dict[str, Any]:
    """Images/s of GPU JPEG decode per batch size: torchvision's nvJPEG (decode alone,
    and ``NvjpegDecoder`` = decode + resize to ``size``), against fastload's CPU path
    (Pillow, draft mode, resize) in a thread per core in the same run; DALI's "mixed"
    decoder too when DALI is importable. Also checks the GPU output against the CPU
    path's pixels."""
    import importlib.util

    import numpy as np

    from fastload.decode import decode_image, to_tensor
    from fastload.packed import PackedBytes

    cuda = device.startswith("cuda")
    sync = _sync(torch, device)
    result: dict[str, Any] = {
        "images": len(blobs),
        "mean_jpeg_bytes": sum(map(len, blobs)) / len(blobs),
        "size": size,
    }

    def batch_of(bs: int) -> list[bytes]:
        return [blobs[i % len(blobs)] for i in range(bs)]

    def cpu_path() -> dict[str, Any]:
        threads = os.cpu_count() or 1
        work = batch_of(max(batch_sizes))

        def one(b: bytes) -> Any:
            return to_tensor(decode_image(b, size=size, resize="exact"))

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, work[:threads]))  # warm-up
            t0 = time.perf_counter()
            done = 0
            while done < 2 * len(work) and time_left() > 15:
                list(pool.map(one, work))
                done += len(work)
            dt = time.perf_counter() - t0
        return {"threads": threads, "images": done, "img_s": done / dt}

    part(result, "cpu_path", cpu_path)

    def nvjpeg() -> dict[str, Any]:
        from fastload.decode.gpu import NvjpegDecoder, torchvision_io

        tvio = torchvision_io()
        mode = tvio.ImageReadMode.RGB
        out: dict[str, Any] = {"device": device}
        rows = []
        for bs in batch_sizes:
            if time_left() < 15:
                rows.append({"batch_size": bs, "status": "skipped", "reason": "time budget"})
                continue
            packed = PackedBytes.from_list(batch_of(bs))
            if cuda:
                packed = packed.pin_memory()
            items = packed.tensors()
            decoder = NvjpegDecoder(size, device=device, resize="exact")
            row: dict[str, Any] = {"batch_size": bs}
            calls: list[tuple[str, Callable[[], Any]]] = [
                ("decode", lambda i=items: tvio.decode_jpeg(i, mode=mode, device=device)),
                ("decode_resize", lambda d=decoder, p=packed: d.decode_field(p)),
            ]
            for name, call in calls:
                call()
                call()  # warm-up (nvJPEG handles, allocator)
                sync()
                t0 = time.perf_counter()
                n = 0
                for _ in range(iters):
                    call()
                    n += bs
                    if time_left() < 10:
                        break
                sync()
                row[f"{name}_img_s"] = n / (time.perf_counter() - t0)
            rows.append(row)
        out["rows"] = rows
        # the GPU output against the CPU path's, on a few images (the tolerances of
        # tests/gpu/test_nvjpeg.py: mean <= 3, p99 <= 12, max <= 48)
        few = blobs[: min(8, len(blobs))]
        got = NvjpegDecoder(size, device=device)({"jpg": PackedBytes.from_list(few)})["jpg"].cpu()
        diffs = []
        for i, b in enumerate(few):
            ref = np.asarray(decode_image(b, size=size, resize="exact")).astype(np.int16)
            img = got[i].permute(1, 2, 0).numpy().astype(np.int16)
            diffs.append(np.abs(img - ref))
        d = np.stack(diffs)
        out["vs_cpu_path"] = {
            "mean_abs": float(d.mean()),
            "p99_abs": float(np.percentile(d, 99)),
            "max_abs": int(d.max()),
            # the figures stand either way; tests/gpu/test_nvjpeg.py fails on a miss
            "within_tolerances": bool(
                d.mean() <= 3 and np.percentile(d, 99) <= 12 and d.max() <= 48
            ),
        }
        return out

    part(result, "nvjpeg", nvjpeg)

    def dali() -> dict[str, Any]:
        try:
            found = importlib.util.find_spec("nvidia.dali") is not None
        except ImportError:  # no "nvidia" package at all
            found = False
        if not found:
            return {"status": "skipped", "reason": "nvidia.dali is not installed"}
        from nvidia.dali import fn, pipeline_def, types

        files = []
        for i, b in enumerate(blobs):
            path = os.path.join(tmpdir, f"{i:06d}.jpg")
            with open(path, "wb") as f:
                f.write(b)
            files.append(path)
        dev = "mixed" if cuda else "cpu"

        @pipeline_def  # type: ignore[untyped-decorator,misc]
        def pipe_def() -> Any:
            jpegs, _ = fn.readers.file(files=files, random_shuffle=False)  # type: ignore[attr-defined]
            images = fn.decoders.image(jpegs, device=dev, output_type=types.RGB)  # type: ignore[attr-defined]
            return fn.resize(images, resize_x=size, resize_y=size)  # type: ignore[attr-defined]

        rows = []
        for bs in batch_sizes:
            if time_left() < 15:
                rows.append({"batch_size": bs, "status": "skipped", "reason": "time budget"})
                continue
            pipe = pipe_def(
                batch_size=bs,
                num_threads=min(8, os.cpu_count() or 1),
                device_id=torch.cuda.current_device() if cuda else None,
            )
            pipe.build()
            pipe.run()
            t0 = time.perf_counter()
            n = 0
            for _ in range(iters):
                (images,) = pipe.run()
                n += bs
                if time_left() < 10:
                    break
            if cuda:
                images.as_cpu()  # the last batch is complete, so every batch is
            rows.append({"batch_size": bs, "img_s": n / (time.perf_counter() - t0)})
            del pipe
        return {"device": dev, "rows": rows}

    part(result, "dali", dali)
    base = result["cpu_path"].get("img_s")
    for row in result["nvjpeg"].get("rows", []):
        if base and "decode_resize_img_s" in row:
            row["over_cpu_path"] = row["decode_resize_img_s"] / base
    return result
