#!/usr/bin/env python
"""GPU check: host-to-device bandwidth, DALI nvJPEG decode rate, and how long a
ResNet-50-sized training step waits for ``fastload.DataLoader(device="cuda")``.

Each measurement comes with a baseline from the same run:

* ``h2d``: pageable vs pinned copies of several sizes (GB/s, ratio pinned/pageable);
* ``feed``: batches/s delivered on the device from ready tensors by
  ``fastload.DataLoader(device=...)`` vs torch's DataLoader with ``pin_memory=True``
  and ``.to(device, non_blocking=True)`` in the loop;
* ``dali_decode``: ``fn.decoders.image(device="mixed")`` images/s at batch sizes
  32/128/256 over generated 640x480 JPEGs, against DALI's CPU decoder;
* ``train``: a ResNet-50 (defined inline, bf16 autocast, channels-last) fed from
  a fixed on-device batch (the ceiling) and from ``fastload.DataLoader`` over a
  generated JPEG dataset decoded by Pillow in workers; reports the fraction of
  wall time the loop waited for batches and loader img/s / ceiling img/s.

Writes ``<out>/gpu_check.json`` after every section (so a time-out still leaves
the finished parts). A global time budget (``--budget-s``) bounds the whole run;
a hard alarm 30 s past it writes what exists and exits 3. Needs no network.
``--dry-run`` runs tiny CPU versions of every part and exits 0 (tested in
``tests/loader/test_loader_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

RESULT_VERSION = 1
DEFAULT_SIZES_MB = (1, 16, 64, 256)
DEFAULT_DALI_BATCHES = (32, 128, 256)


class Budget:
    """A global deadline: sections ask how much time is left."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Report:
    """The JSON document, rewritten to disk after each section."""

    def __init__(self, path: Path, argv: list[str]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "version": RESULT_VERSION,
            "command": " ".join(["benchmarks/gpu/gpu_check.py", *argv]),
            "complete": False,
        }

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path)


def _explicit_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options given on the command line (not defaulted)."""
    probe = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            kwargs: dict[str, Any] = {"dest": action.dest}
            if action.nargs == 0:
                kwargs["action"] = "store_true"
            else:
                kwargs["nargs"] = action.nargs
            probe.add_argument(*action.option_strings, **kwargs)
    return set(vars(probe.parse_known_args(argv)[0]))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default=".", help="directory for gpu_check.json")
    p.add_argument("--dry-run", action="store_true", help="tiny CPU versions of every part")
    p.add_argument("--budget-s", type=float, default=450.0, help="global time budget")
    p.add_argument("--sizes-mb", type=float, nargs="+", default=list(DEFAULT_SIZES_MB))
    p.add_argument("--copy-repeats", type=int, default=20)
    p.add_argument("--dali-batches", type=int, nargs="+", default=list(DEFAULT_DALI_BATCHES))
    p.add_argument("--dali-images", type=int, default=512, help="generated JPEGs")
    p.add_argument("--dali-iters", type=int, default=20, help="timed iterations per batch size")
    p.add_argument("--train-batch", type=int, default=256)
    p.add_argument("--train-steps", type=int, default=40, help="timed steps per mode")
    p.add_argument("--train-images", type=int, default=1024, help="generated dataset size")
    p.add_argument("--feed-batches", type=int, default=60, help="batches per feed run")
    p.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["h2d", "feed", "dali", "train"],
        help="parts to skip",
    )
    args = p.parse_args(argv)
    if args.dry_run:
        # tiny sizes for every option left at its default (explicit options win)
        tiny = {
            "sizes_mb": [0.25],
            "copy_repeats": 2,
            "dali_batches": [4],
            "dali_images": 8,
            "dali_iters": 2,
            "train_batch": 4,
            "train_steps": 3,
            "train_images": 16,
            "feed_batches": 4,
            "workers": 0,
        }
        given = _explicit_options(p, argv)
        for name, value in tiny.items():
            if name not in given:
                setattr(args, name, value)
    return args


def environment(torch: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["cuda"] = torch.version.cuda
    return facts  # the DALI version is added by the DALI part (importing it is slow)


def _dali_version() -> str:
    import nvidia.dali  # raises ImportError when DALI is not installed

    return str(nvidia.dali.__version__)


# ---------------------------------------------------------------------- H2D copies
def h2d_bandwidth(
    torch: Any, device: str, sizes_mb: list[float], repeats: int, budget: Budget
) -> list[dict[str, Any]]:
    """GB/s of pageable and pinned host-to-device copies for each size."""
    cuda = device.startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for mb in sizes_mb:
        if budget.left() < 5:
            rows.append({"size_mb": mb, "skipped": "time budget"})
            continue
        n = int(mb * 1e6)
        dst = torch.empty(n, dtype=torch.uint8, device=device)
        row: dict[str, Any] = {"size_mb": mb}
        kinds = [("pageable", False), ("pinned", True)] if cuda else [("pageable", False)]
        for name, pinned in kinds:
            src = torch.randint(0, 255, (n,), dtype=torch.uint8)
            if pinned:
                src = src.pin_memory()
            dst.copy_(src, non_blocking=pinned)  # warm-up
            sync()
            t0 = time.perf_counter()
            for _ in range(repeats):
                dst.copy_(src, non_blocking=pinned)
            sync()
            dt = time.perf_counter() - t0
            row[f"{name}_gb_s"] = n * repeats / dt / 1e9
        if "pinned_gb_s" in row:
            row["pinned_over_pageable"] = row["pinned_gb_s"] / row["pageable_gb_s"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- data
def jpeg_bytes(n: int, width: int, height: int, seed: int = 0) -> list[bytes]:
    """``n`` photo-like JPEGs (smooth gradients plus noise, quality 90)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for _ in range(n):
        a, b, c = rng.uniform(0.2, 1.0, 3)
        base = np.stack(
            [
                128 + 100 * np.sin(xx * a / 40 + yy * b / 60),
                128 + 100 * np.cos(yy * c / 35),
                128 + 100 * np.sin((xx + yy) * b / 50),
            ],
            axis=-1,
        )
        noisy = base + rng.normal(0, 12, base.shape)
        img = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def dali_decode(
    files: list[str], batch_sizes: list[int], device: str, iters: int, budget: Budget, threads: int
) -> list[dict[str, Any]]:
    """Images/s of DALI's image decoder on ``device`` ("mixed" or "cpu") per batch size."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def decode_pipe(file_list: list[str], dev: str) -> Any:
        jpegs, _ = fn.readers.file(files=file_list, name="Reader", random_shuffle=False)
        return fn.decoders.image(jpegs, device=dev, output_type=types.RGB)  # type: ignore[attr-defined]

    rows = []
    for bs in batch_sizes:
        if budget.left() < 15:
            rows.append({"batch_size": bs, "device": device, "skipped": "time budget"})
            continue
        device_id = 0 if device == "mixed" else None
        pipe = decode_pipe(
            file_list=files,
            dev=device,
            batch_size=bs,
            num_threads=threads,
            device_id=device_id,
            prefetch_queue_depth=2,
        )
        pipe.build()
        for _ in range(2):
            pipe.run()
        done = 0
        t0 = time.perf_counter()
        for _ in range(iters):
            (images,) = pipe.run()
            done += len(images)
            if budget.left() < 5:
                break
        if device == "mixed":
            images.as_cpu()  # the last batch is complete, so every batch is
        dt = time.perf_counter() - t0
        rows.append({"batch_size": bs, "device": device, "images": done, "img_s": done / dt})
        del pipe
    return rows


# ---------------------------------------------------------------------- model
def resnet50(torch: Any, width: int = 64, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> Any:
    """ResNet-50 (bottleneck blocks, expansion 4), written out: torchvision is not needed."""
    nn = torch.nn

    class Bottleneck(nn.Module):  # type: ignore[name-defined]
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.relu(self.body(x) + self.skip(x))

    layers: list[Any] = [
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    cin = width
    for stage, count in enumerate(blocks):
        mid = width * 2**stage
        for i in range(count):
            layers.append(Bottleneck(cin, mid, 2 if (i == 0 and stage > 0) else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


class JpegDataset:
    """Map-style dataset over in-memory JPEG bytes: decode with Pillow, centre-crop and
    resize to ``size``, return ``{"image": uint8 CHW tensor, "label": int}``."""

    def __init__(self, blobs: list[bytes], size: int) -> None:
        self.blobs = blobs
        self.size = size

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        side = min(img.size)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side)).resize((self.size, self.size))
        arr = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()
        return {"image": arr, "label": i % 1000}


def train_wait(
    torch: Any,
    device: str,
    blobs: list[bytes],
    *,
    image_size: int,
    batch_size: int,
    steps: int,
    workers: int,
    tiny: bool,
    budget: Budget,
) -> dict[str, Any]:
    """Ceiling (fixed on-device batch) vs fastload.DataLoader-fed training steps."""
    import fastload

    cuda = device.startswith("cuda")
    model = (resnet50(torch, width=8, blocks=(1, 1, 1, 1)) if tiny else resnet50(torch)).to(
        device, memory_format=torch.channels_last
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)

    def step(images: Any, labels: Any) -> None:
        x = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        # bf16 autocast on the GPU; the CPU dry run stays in float32 (CPU bf16 convs are slow)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    warmup = 2 if tiny else 5
    fixed_images = torch.randint(
        0, 255, (batch_size, 3, image_size, image_size), dtype=torch.uint8, device=device
    )
    fixed_labels = torch.randint(0, 1000, (batch_size,), device=device)
    for _ in range(warmup):
        step(fixed_images, fixed_labels)
    sync()
    t0 = time.perf_counter()
    done = 0
    for _ in range(steps):
        step(fixed_images, fixed_labels)
        done += 1
        if budget.left() < 20:
            break
    sync()
    ceiling_s = time.perf_counter() - t0
    ceiling_img_s = done * batch_size / ceiling_s

    loader = fastload.DataLoader(
        JpegDataset(blobs, image_size),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        device=device,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        world=fastload.World.single(),
    )
    if len(loader) == 0:
        raise SystemExit(f"train: {len(blobs)} images make no batch of {batch_size}")

    def batches() -> Any:
        while True:
            yield from loader

    feed = batches()
    for _ in range(warmup):
        b = next(feed)
        step(b["image"], b["label"])
    sync()
    before = loader.stats()
    t0 = time.perf_counter()
    fed = 0
    for _ in range(steps):
        b = next(feed)
        step(b["image"], b["label"])
        fed += 1
        if budget.left() < 10:
            break
    sync()
    loader_s = time.perf_counter() - t0
    after = loader.stats()
    waited = after.wait_total_s - before.wait_total_s
    loader_img_s = fed * batch_size / loader_s
    result = {
        "image_size": image_size,
        "batch_size": batch_size,
        "workers": workers,
        "model": "resnet50-tiny" if tiny else "resnet50",
        "ceiling_steps": done,
        "ceiling_img_s": ceiling_img_s,
        "loader_steps": fed,
        "loader_img_s": loader_img_s,
        "loader_over_ceiling": loader_img_s / ceiling_img_s,
        "wait_fraction": waited / loader_s,
        "wait_mean_ms": 1e3 * waited / max(fed, 1),
        "wait_p95_ms_all_batches": 1e3 * after.wait_p95_s,
        "pool": None if loader.pool_stats() is None else vars(loader.pool_stats()),
    }
    return result


# ---------------------------------------------------------------------- feed rate
class PreparedImages:
    """Map-style dataset of ready uint8 CHW tensors (no decode: the feed path alone)."""

    def __init__(self, torch: Any, n: int, size: int, distinct: int = 64) -> None:
        self.n = n
        self.images = torch.randint(0, 255, (distinct, 3, size, size), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.images[i % len(self.images)], "label": i % 1000}


def feed_rate(
    torch: Any,
    device: str,
    *,
    image_size: int,
    batch_size: int,
    batches: int,
    workers: int,
    budget: Budget,
) -> dict[str, Any]:
    """Batches/s delivered on ``device``: torch's DataLoader (pin_memory, then
    ``.to(device, non_blocking=True)`` in the loop: the usual recipe, the baseline)
    vs ``fastload.DataLoader(device=...)`` (on CPU: without ``device``, i.e. the
    wrapper's own overhead). The consumer does one small kernel."""
    import fastload

    cuda = device.startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    ds = PreparedImages(torch, batches * batch_size, image_size)
    common: dict[str, Any] = {"batch_size": batch_size, "num_workers": workers, "drop_last": True}
    if workers > 0:
        common.update(persistent_workers=False, prefetch_factor=4)

    def consume(batch: Any, acc: Any) -> Any:
        return acc + batch["image"][:, :, :8, :8].float().mean()

    def timed(make_iter: Callable[[], Any]) -> float:
        acc = torch.zeros((), device=device)
        t0 = time.perf_counter()
        count = 0
        for batch in make_iter():
            acc = consume(batch, acc)
            count += 1
            if budget.left() < 10:
                break
        sync()
        return count / (time.perf_counter() - t0)

    def torch_recipe() -> Any:
        loader = torch.utils.data.DataLoader(ds, pin_memory=cuda, **common)
        for b in loader:
            yield {k: v.to(device, non_blocking=cuda) for k, v in b.items()}

    def fastload_loader() -> Any:
        # off CUDA the baseline's .to("cpu") is free, so compare the plain wrapper there
        target = device if cuda else None
        return fastload.DataLoader(ds, device=target, world=fastload.World.single(), **common)

    timed(torch_recipe)  # warm-up: page cache, CUDA context, allocator
    base = timed(torch_recipe)
    ours = timed(fastload_loader)
    mb = batch_size * 3 * image_size * image_size / 1e6
    return {
        "batch_size": batch_size,
        "image_size": image_size,
        "workers": workers,
        "batch_mb": mb,
        "torch_batches_s": base,
        "fastload_batches_s": ours,
        "fastload_over_torch": ours / base,
        "fastload_gb_s": ours * mb / 1e3,
    }


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    report = Report(Path(args.out) / "gpu_check.json", argv)
    report.set("dry_run", args.dry_run)

    def hard_stop(signum: int, frame: FrameType | None) -> None:
        report.set("error", f"hard time guard: {budget.elapsed():.0f} s elapsed")
        print("gpu_check: hard time guard hit; partial results written", file=sys.stderr)
        os._exit(3)

    signal.signal(signal.SIGALRM, hard_stop)
    signal.alarm(int(args.budget_s) + 30)
    try:
        return _run(args, budget, report)
    finally:
        signal.alarm(0)


def _run(args: argparse.Namespace, budget: Budget, report: Report) -> int:
    import torch

    report.set("env", environment(torch))
    if not args.dry_run and not torch.cuda.is_available():
        report.set("error", "no CUDA device; use --dry-run for the CPU check")
        print("gpu_check: no CUDA device (use --dry-run)", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"

    if "h2d" not in args.skip:
        rows = h2d_bandwidth(torch, device, args.sizes_mb, args.copy_repeats, budget)
        report.set("h2d", rows)
        for r in rows:
            print("h2d", json.dumps(r))

    if "feed" not in args.skip:
        feed = feed_rate(
            torch,
            device,
            image_size=32 if args.dry_run else 224,
            batch_size=args.train_batch,
            batches=args.feed_batches,
            workers=args.workers,
            budget=budget,
        )
        report.set("feed", feed)
        print("feed", json.dumps(feed))

    with tempfile.TemporaryDirectory(prefix="fastload-gpu-check-") as tmp:
        if "dali" not in args.skip:
            size = (64, 48) if args.dry_run else (640, 480)
            blobs = jpeg_bytes(args.dali_images, *size)
            files = []
            for i, blob in enumerate(blobs):
                path = Path(tmp) / f"{i:06d}.jpg"
                path.write_bytes(blob)
                files.append(str(path))
            try:
                threads = min(8, os.cpu_count() or 1)
                decode: dict[str, Any] = {
                    "dali": _dali_version(),
                    "images": len(files),
                    "size": list(size),
                    "mean_jpeg_bytes": sum(map(len, blobs)) / len(blobs),
                }
                if args.dry_run:
                    decode["cpu"] = dali_decode(
                        files, args.dali_batches, "cpu", args.dali_iters, budget, threads
                    )
                else:
                    decode["mixed"] = dali_decode(
                        files, args.dali_batches, "mixed", args.dali_iters, budget, threads
                    )
                    decode["cpu_baseline"] = dali_decode(
                        files, [128], "cpu", max(3, args.dali_iters // 4), budget, threads
                    )
                    base = decode["cpu_baseline"][0].get("img_s")
                    for row in decode["mixed"]:
                        if base and "img_s" in row:
                            row["over_cpu_baseline"] = row["img_s"] / base
            except ImportError:
                decode = {"skipped": "nvidia.dali is not installed"}
            report.set("dali_decode", decode)
            print("dali_decode", json.dumps(decode))

        if "train" not in args.skip:
            if budget.left() < 60 and not args.dry_run:
                report.set("train", {"skipped": "time budget"})
            else:
                size = (64, 48) if args.dry_run else (640, 480)
                blobs = jpeg_bytes(args.train_images, *size, seed=1)
                train = train_wait(
                    torch,
                    device,
                    blobs,
                    image_size=32 if args.dry_run else 224,
                    batch_size=args.train_batch,
                    steps=args.train_steps,
                    workers=args.workers,
                    tiny=args.dry_run,
                    budget=budget,
                )
                report.set("train", train)
                print("train", json.dumps(train))

    report.data["elapsed_s"] = budget.elapsed()
    report.set("complete", True)
    print(f"gpu_check: wrote {report.path} in {budget.elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
