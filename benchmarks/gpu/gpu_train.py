"""The GPU check's training section: how much of a ResNet-50 bf16 step waits for data.

Four feeds of the same model in one run, over one generated JPEG set:

* ``ceiling``: a fixed batch already on the device (the model alone);
* ``torch``: ``torch.utils.data.DataLoader`` (workers decode with fastload's CPU path,
  ``pin_memory=True``, ``.to(device, non_blocking=True)`` in the loop): the baseline;
* ``fastload``: ``fastload.DataLoader(device=...)`` over the same dataset;
* ``fastload_nvjpeg``: ``fastload.DataLoader`` delivering the encoded bytes as pinned
  ``PackedBytes``, decoded and resized on the GPU by ``NvjpegDecoder`` (needs
  torchvision; skipped without it).

Each step ends with a synchronisation (as a loop logging ``loss.item()`` every step
does), so the time spent in ``next()`` is time the GPU had nothing to do. The epoch
is longer than warm-up plus timed steps, so no loader restarts inside the window.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from gpu_data import JpegDataset, RawJpegDataset, pack_jpegs


def resnet50(torch: Any, width: int = 64, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> Any:
    """ResNet-50 (bottleneck blocks, expansion 4), written out: torchvision is not needed."""
    nn = torch.nn

    class Bottleneck(nn.Module):  # type: ignore[name-defined,misc]
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


class Trainer:
    """One model and optimiser; :meth:`step` runs a bf16 (CUDA) training step and
    synchronises, :meth:`run` times ``steps`` steps fed by ``feed``."""

    def __init__(self, torch: Any, device: str, tiny: bool) -> None:
        self.torch = torch
        self.device = device
        self.cuda = device.startswith("cuda")
        model = resnet50(torch, width=8, blocks=(1, 1, 1, 1)) if tiny else resnet50(torch)
        self.model = model.to(device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
        if self.cuda:
            torch.backends.cudnn.benchmark = True

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def step(self, images: Any, labels: Any) -> None:
        torch = self.torch
        x = ((images.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        # bf16 autocast on the GPU; the CPU dry run stays in float32 (CPU bf16 convs are slow)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda):
            loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sync()

    def run(
        self,
        feed: Iterator[tuple[Any, Any]],
        *,
        warmup: int,
        steps: int,
        batch_size: int,
        time_left: Callable[[], float],
    ) -> dict[str, Any]:
        """Warm up, then time ``steps`` steps; the wait is the time spent in ``feed``."""
        for _ in range(warmup):
            self.step(*next(feed))
        waited = 0.0
        done = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            w0 = time.perf_counter()
            images, labels = next(feed)
            waited += time.perf_counter() - w0
            self.step(images, labels)
            done += 1
            if time_left() < 10:
                break
        elapsed = time.perf_counter() - t0
        return {
            "steps": done,
            "img_s": done * batch_size / elapsed,
            "step_ms": 1e3 * elapsed / max(done, 1),
            "wait_fraction": waited / elapsed,
            "wait_ms_per_step": 1e3 * waited / max(done, 1),
        }


def train_section(
    torch: Any,
    device: str,
    blobs: list[bytes],
    *,
    image_size: int,
    batch_size: int,
    steps: int,
    warmup: int,
    workers: int,
    prefetch: int,
    tiny: bool,
    time_left: Callable[[], float],
) -> dict[str, Any]:
    """The four feeds (see the module docstring); each feed in its own ``try``."""
    import fastload

    cuda = device.startswith("cuda")
    trainer = Trainer(torch, device, tiny)
    # enough samples that warm-up + timed steps + the loader's read-ahead fit in one epoch
    ahead = max(1, workers) * prefetch + 4
    length = batch_size * (warmup + steps + ahead)
    result: dict[str, Any] = {
        "model": "resnet50-tiny" if tiny else "resnet50",
        "dtype": "bf16-autocast" if cuda else "float32",
        "image_size": image_size,
        "batch_size": batch_size,
        "workers": workers,
        "prefetch_factor": prefetch if workers else None,
        "epoch_batches": length // batch_size,
        "timed_window_batches": warmup + steps,
        "distinct_jpegs": len(blobs),
        "mean_jpeg_bytes": sum(map(len, blobs)) / max(len(blobs), 1),
    }
    run = dict(warmup=warmup, steps=steps, batch_size=batch_size, time_left=time_left)
    common: dict[str, Any] = {"batch_size": batch_size, "num_workers": workers, "drop_last": True}
    if workers:
        common.update(prefetch_factor=prefetch, persistent_workers=False)
    dataset = JpegDataset(blobs, image_size, length)
    errors = 0

    def ceiling() -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(0, 255, (batch_size, 3, image_size, image_size), dtype=torch.uint8)
        images = x.to(device)
        labels = torch.randint(0, 1000, (batch_size,), generator=gen).to(device)

        def fixed() -> Iterator[tuple[Any, Any]]:
            while True:
                yield images, labels

        return trainer.run(fixed(), **run)

    def torch_loader() -> dict[str, Any]:
        loader = torch.utils.data.DataLoader(dataset, shuffle=True, pin_memory=cuda, **common)
        it = iter(loader)

        def feed(batches: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
            for b in batches:
                yield (
                    b["image"].to(device, non_blocking=cuda),
                    b["label"].to(device, non_blocking=cuda),
                )

        try:
            return trainer.run(feed(it), **run)
        finally:
            del it

    def fastload_loader() -> dict[str, Any]:
        loader = fastload.DataLoader(
            dataset, shuffle=True, device=device, world=fastload.World.single(), **common
        )
        it = iter(loader)

        def feed(batches: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
            for b in batches:
                yield b["image"], b["label"]

        try:
            out = trainer.run(feed(it), **run)
            stats = loader.stats()
            pool = loader.pool_stats()
            out["loader_wait_p95_ms"] = 1e3 * stats.wait_p95_s
            out["pool"] = None if pool is None else vars(pool)
            return out
        finally:
            del it
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    def fastload_nvjpeg() -> dict[str, Any]:
        from fastload.decode.gpu import NvjpegDecoder, torchvision_io

        torchvision_io()  # MissingDependencyError -> skipped
        decoder = NvjpegDecoder(image_size, device=device, resize="exact")
        loader = fastload.DataLoader(
            RawJpegDataset(blobs, length),
            shuffle=True,
            collate_fn=pack_jpegs,
            pin_memory=cuda,  # torch's pin thread pins each PackedBytes whole
            world=fastload.World.single(),
            **common,
        )
        it = iter(loader)
        decode_s = [0.0]

        def feed(batches: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
            for b in batches:
                t0 = time.perf_counter()
                images = decoder.decode_field(b["jpg"], "jpg")
                decode_s[0] += time.perf_counter() - t0
                yield images, b["label"].to(device, non_blocking=cuda)

        try:
            out = trainer.run(feed(it), **run)
            out["decoded"] = decoder.decoded
            out["fallbacks"] = decoder.fallbacks
            out["note"] = "wait includes the nvJPEG decode + resize call (host side)"
            return out
        finally:
            del it
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    for name, fn in [
        ("ceiling", ceiling),
        ("torch", torch_loader),
        ("fastload", fastload_loader),
        ("fastload_nvjpeg", fastload_nvjpeg),
    ]:
        if time_left() < 25:
            result[name] = {"status": "skipped", "reason": "time budget"}
            continue
        t0 = time.monotonic()
        try:
            result[name] = {"status": "ok", **fn()}
        except ImportError as exc:  # MissingDependencyError is an ImportError
            result[name] = {"status": "skipped", "reason": str(exc)}
        except Exception:
            errors += 1
            result[name] = {"status": "error", "traceback": traceback.format_exc()}
        result[name]["seconds"] = round(time.monotonic() - t0, 2)
        gc.collect()  # workers of a finished feed exit before the next starts
    ceil = result["ceiling"].get("img_s")
    for name in ("torch", "fastload", "fastload_nvjpeg"):
        row = result[name]
        if ceil and "img_s" in row:
            row["over_ceiling"] = row["img_s"] / ceil
    base = result["torch"].get("wait_fraction")
    for name in ("fastload", "fastload_nvjpeg"):
        row = result[name]
        if base is not None and "img_s" in row and "img_s" in result["torch"]:
            row["img_s_over_torch"] = row["img_s"] / result["torch"]["img_s"]
            row["torch_wait_fraction"] = base
    if errors:
        result["status"] = "error"
    return result
