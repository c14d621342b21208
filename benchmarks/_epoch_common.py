"""Shared parts of the whole-epoch benchmarks (``bench_epoch.py``, ``bench_remote_epoch.py``,
``bench_transport.py``).

* COCO-sized JPEGs (640x480, quality 90, ~155 KB of photo-like content) written
  as an image folder (one directory per class), so :func:`fastload.convert.folder`
  makes shards of the very same files;
* the naive baseline's per-image work: PIL decode, ``convert("RGB")``, resize to
  224x224 bilinear, ``uint8`` CHW tensor (what torchvision's ``Resize`` +
  ``PILToTensor`` give);
* epoch timing (wall clock, and CPU seconds of the main process plus its reaped
  DataLoader workers), interleaved variants, median/spread summaries, environment;
* the flags every epoch benchmark takes (:func:`epoch_parser`), the fields its JSON
  opens with (:func:`doc_head`) and its report (:func:`report`).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import mmap
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SIZE = (224, 224)  # (height, width) of the decoded output
IMAGE_WH = (640, 480)
JPEG_QUALITY = 90


# ----------------------------------------------------------------------- data set
_BASE: np.ndarray | None = None


def photo_like(seed: int, noise: int = 31) -> np.ndarray:
    """A 640x480 RGB image: smooth colour waves (one precomputed field, cropped at a
    random offset), hard-edged boxes and uniform noise. At JPEG quality 90 it is
    ~155 KB, COCO's mean file size, and costs about what ``bench_decode.py``'s images
    cost to decode; it is ~20x cheaper to make than those (which compute the waves
    per image)."""
    global _BASE
    w, h = IMAGE_WH
    if _BASE is None:
        yy, xx = np.mgrid[0 : 2 * h, 0 : 2 * w].astype(np.float32)
        planes = [
            128
            + 70 * np.sin(xx / 37 + p) * np.cos(yy / 23 - p)
            + 35 * np.sin((xx + yy) / 11 + 2 * p)
            for p in (0.0, 2.1, 4.2)
        ]
        _BASE = np.stack(planes, axis=-1).astype(np.int16)
    rng = np.random.default_rng(seed)
    oy, ox = int(rng.integers(0, h)), int(rng.integers(0, w))
    img = _BASE[oy : oy + h, ox : ox + w].copy()
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        bw, bh = int(rng.integers(20, w // 3)), int(rng.integers(20, h // 3))
        img[y0 : y0 + bh, x0 : x0 + bw] = rng.integers(0, 255, 3)
    img += rng.integers(-noise, noise + 1, img.shape, dtype=np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(seed: int) -> bytes:
    """:func:`photo_like` image ``seed`` as a quality-90 JPEG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(photo_like(seed)).save(buf, "JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def make_image_folder(root: Path, count: int, classes: int = 4) -> list[Path]:
    """Write ``count`` 640x480 JPEGs under ``root/class-<k>/img-<i>.jpg`` (image ``i`` in
    class ``i % classes``) unless they are there already; returns the paths in
    ``ImageFolder`` order (classes sorted, files sorted), the order of the shards."""
    for i in range(count):
        path = root / f"class-{i % classes}" / f"img-{i:05d}.jpg"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(jpeg_bytes(i))
    return sorted(root.glob("class-*/img-*.jpg"), key=lambda p: (p.parent.name, p.name))


def folder_labels(paths: Sequence[Path]) -> list[int]:
    """Class index of each path (sorted class directory names, like ``ImageFolder``)."""
    classes = sorted({p.parent.name for p in paths})
    index = {c: i for i, c in enumerate(classes)}
    return [index[p.parent.name] for p in paths]


# ------------------------------------------------------------------ the baseline
def plain_decode_tensor(data: bytes) -> Any:
    """The naive per-image decode: ``Image.open``, ``convert("RGB")``, ``resize((224,
    224), BILINEAR)``, then a ``uint8`` CHW tensor (a permuted view, as torchvision's
    ``pil_to_tensor`` returns)."""
    import torch
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    img = img.resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


def batch_images(batch: Any) -> int:
    """Number of samples in a collated batch of any of the benchmark's variants
    (fastload's raw fields come as :class:`fastload.packed.PackedBytes`)."""
    import torch

    from fastload.packed import PackedBytes

    if isinstance(batch, (torch.Tensor, PackedBytes)):
        return len(batch)
    if isinstance(batch, Mapping):
        for key in ("jpg", "image", "__key__"):
            if key in batch:
                return batch_images(batch[key])
        raise ValueError(f"cannot count the samples of a batch with keys {sorted(batch)}")
    if isinstance(batch, (list, tuple)):
        first = batch[0]
        if isinstance(first, (bytes, bytearray, memoryview, str)):
            return len(batch)
        return batch_images(first)
    raise ValueError(f"cannot count the samples of a {type(batch).__name__}")


def batch_payload_bytes(batch: Any) -> int:
    """Bytes of raw (undecoded) image payload in a batch; 0 for decoded batches."""
    from fastload.packed import PackedBytes

    if isinstance(batch, Mapping):
        value = batch.get("jpg")
        if isinstance(value, PackedBytes):
            return value.nbytes
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return sum(len(v) for v in value)
        return 0
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], list):
        return sum(len(v) for v in batch[0] if isinstance(v, (bytes, bytearray)))
    return 0


# ------------------------------------------------ the VM's free page reporting
#: Where a guest kernel with free page reporting (virtio-balloon) shows its counters.
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")


def reporting_passes() -> int | None:
    """How many free page reporting passes the kernel has run (None where it has no
    such counter: bare metal, or a guest without free page reporting)."""
    try:
        return int((PAGE_REPORTING / "passes").read_text())
    except (OSError, ValueError):
        return None


def passes_since(before: int | None) -> dict[str, int]:
    """``{"reporting_passes": n}``: the passes run since ``reporting_passes()`` gave
    ``before`` (``{}`` where the kernel has no counter), for an epoch's facts."""
    if before is None:
        return {}
    return {"reporting_passes": (reporting_passes() or before) - before}


def report_free_pages_now(timeout_s: float = 15.0) -> bool:
    """Make the guest's free page reporting run now (untimed) and wait until it has:
    fault in and free a little more than ``max_waiting_mib`` of anonymous memory,
    then wait for the pass counter to move. Memory freed before this call then no
    longer starts a pass inside the next timed epoch. True if a pass was counted;
    False where the kernel has no counter (bare metal, other guests) or none came."""
    before = reporting_passes()
    if before is None:
        return False
    try:
        waiting_mib = int((PAGE_REPORTING / "max_waiting_mib").read_text())
    except (OSError, ValueError):
        waiting_mib = 1024
    t0 = time.perf_counter()
    buf = mmap.mmap(-1, (waiting_mib + 256) << 20)
    np.frombuffer(buf, dtype=np.uint8)[:: mmap.PAGESIZE] = 1  # fault every page in
    buf.close()
    after = before
    while after == before and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.02)
        after = reporting_passes() or before
    return after != before


# ---------------------------------------------------------------------- timing
def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Epoch:
    """One timed epoch: samples and raw bytes delivered, wall and CPU seconds."""

    samples: int
    payload_bytes: int
    wall_s: float
    cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def time_epoch(
    make_loader: Callable[[], Iterable[Any]],
    probe: Callable[[Any], dict[str, Any]] | None = None,
) -> Epoch:
    """Build a loader (fresh workers), iterate it to the end, and time it.

    Wall time runs from building the loader to its last batch, so worker start-up is
    inside, as in a training job's epoch. CPU time is this process's plus that of the
    children reaped meanwhile: the DataLoader workers, which torch joins at the end
    of a non-persistent epoch. ``probe(loader)``, called after the epoch (untimed),
    gives the epoch's ``extra`` facts (e.g. I/O counters).
    """
    # Collect cyclic garbage (e.g. s3fs/aiobotocore clients of the previous epoch) here,
    # not in forked workers, whose GC would finalise it on the wrong event loop.
    gc.collect()
    passes = reporting_passes()
    t0, c0 = time.perf_counter(), _cpu_seconds()
    loader = make_loader()
    samples = payload = 0
    for batch in loader:
        samples += batch_images(batch)
        payload += batch_payload_bytes(batch)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    extra = probe(loader) if probe is not None else {}
    extra.update(passes_since(passes))  # did the VM's free page reporting run inside?
    del loader
    return Epoch(samples, payload, wall, cpu, extra)


def interleaved(
    variants: Mapping[str, Callable[[], Epoch]], repeats: int, warmup: bool = True
) -> dict[str, list[Epoch]]:
    """Run every variant once as a warm-up (untimed) and then ``repeats`` times,
    round by round; each round starts one variant later (rotation), so machine load
    and its drift fall on baseline and candidates alike."""
    names = list(variants)
    if warmup:
        for name in names:
            print(f"  warm-up {name}", file=sys.stderr, flush=True)
            variants[name]()
    out: dict[str, list[Epoch]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            epoch = variants[name]()
            out[name].append(epoch)
            print(
                f"  round {r + 1}/{repeats} {name:<22} {epoch.samples / epoch.wall_s:8.1f} "
                f"samples/s ({epoch.wall_s:.2f} s wall, {epoch.cpu_s:.2f} s CPU)",
                file=sys.stderr,
                flush=True,
            )
    return out


def check_count(name: str, counts: Sequence[int], n: int, pad: int) -> None:
    """Every epoch of variant ``name`` delivered all ``n`` samples: exactly ``n``, or up
    to ``pad`` more where the loader pads its last batches with repeated samples
    (``StreamingDataset(drop_last=False)`` fills whole batches on every worker).
    Raises AssertionError otherwise."""
    bad = [c for c in counts if not n <= c < n + pad]
    if bad:
        raise AssertionError(f"{name} delivered {bad} samples per epoch; the dataset has {n}")


def summarize(epochs: Sequence[Epoch], mean_sample_bytes: float) -> dict[str, Any]:
    """Median and [min, max] of samples/s (wall), MB/s of image payload, and samples
    per CPU second (robust to other jobs sharing the machine) over ``epochs``."""
    rates = [e.samples / e.wall_s for e in epochs]
    per_cpu = [e.samples / e.cpu_s for e in epochs if e.cpu_s > 0]
    med = statistics.median(rates)
    return {
        "samples_per_s": med,
        "min": min(rates),
        "max": max(rates),
        "mb_per_s": med * mean_sample_bytes / 1e6,
        "samples_per_cpu_s": statistics.median(per_cpu) if per_cpu else None,
        "wall_s": [round(e.wall_s, 4) for e in epochs],
        "cpu_s": [round(e.cpu_s, 4) for e in epochs],
        "samples": sorted({e.samples for e in epochs}),
        "runs": len(epochs),
    }


def run_checked(
    variants: Mapping[str, Callable[[], Epoch]],
    repeats: int,
    mean_sample_bytes: float,
    n: int,
    pad: int,
) -> tuple[dict[str, list[Epoch]], dict[str, dict[str, Any]]]:
    """:func:`interleaved` rounds of ``variants``, each variant's :func:`summarize`, and
    :func:`check_count` of every epoch against the ``n`` samples (``pad``: repeats
    allowed to fill the last batches). Returns the epochs and the summaries; raises
    AssertionError when a variant dropped samples."""
    epochs = interleaved(variants, repeats)
    results = {name: summarize(e, mean_sample_bytes) for name, e in epochs.items()}
    for name, r in results.items():
        check_count(name, r["samples"], n, pad)
    return epochs, results


def ratios(
    results: dict[str, dict[str, Any]],
    epochs: Mapping[str, Sequence[Epoch]],
    pairs: Mapping[str, str],
) -> dict[str, Any]:
    """``{"a/b": {...}}`` for each candidate ``a`` over baseline ``b``: ``wall`` (ratio
    of the median samples/s), ``paired`` (median over rounds of the ratio within a
    round, where both ran seconds apart) and ``cpu`` (ratio of samples per CPU second,
    the figure least moved by other jobs on the machine)."""
    out: dict[str, Any] = {}
    for cand, base in pairs.items():
        a, b = results[cand], results[base]
        cpu = None
        if a["samples_per_cpu_s"] and b["samples_per_cpu_s"]:
            cpu = a["samples_per_cpu_s"] / b["samples_per_cpu_s"]
        paired = statistics.median(
            (x.samples / x.wall_s) / (y.samples / y.wall_s)
            for x, y in zip(epochs[cand], epochs[base], strict=True)
        )
        out[f"{cand}/{base}"] = {
            "wall": a["samples_per_s"] / b["samples_per_s"],
            "paired": paired,
            "cpu": cpu,
        }
    return out


def print_table(results: dict[str, dict[str, Any]], ratio_rows: dict[str, Any]) -> None:
    """The results as a fixed-width table on stdout."""
    print(f"{'variant':<24} {'samples/s':>10} {'min':>8} {'max':>8} {'MB/s':>8} {'per CPU s':>10}")
    for name, r in results.items():
        cpu = r["samples_per_cpu_s"]
        print(
            f"{name:<24} {r['samples_per_s']:10.1f} {r['min']:8.1f} {r['max']:8.1f} "
            f"{r['mb_per_s']:8.1f} {cpu if cpu is None else round(cpu, 1)!s:>10}"
        )
    for name, r in ratio_rows.items():
        cpu = "n/a" if r["cpu"] is None else f"{r['cpu']:.2f}x"
        print(
            f"ratio {name:<42} wall {r['wall']:.2f}x  paired {r['paired']:.2f}x  "
            f"per CPU second {cpu}"
        )


def environment(cache_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Machine facts (CPU, cores, RAM, disk, versions) and the load average now."""
    from fastload.bench.machine import machine_info

    info = dict(machine_info(cache_dir))
    info["loadavg"] = list(os.getloadavg())
    info["python"] = sys.version.split()[0]
    return info


def epoch_parser(
    doc: str, *, images: int, repeats: int, batch_size: int, shard_size: str
) -> argparse.ArgumentParser:
    """The argument parser of an epoch benchmark (described by the first paragraph of
    its ``doc``, defaults shown) with the flags they all take, at these defaults:
    ``--images``, ``--repeats``, ``--workers`` (2), ``--batch-size``, ``--shard-size``,
    and ``--json FILE``."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--images", type=int, default=images, help="number of JPEGs")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed epochs per variant")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--shard-size", default=shard_size, help="target shard size")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the results here")
    return parser


def doc_head(
    schema: str, images: int, mean_jpeg_bytes: float, shards: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The fields an epoch benchmark's JSON opens with: its schema and command line, the
    images (640x480, their mean JPEG size) and shards, and the run's settings from the
    :func:`epoch_parser` flags."""
    return {
        "schema": schema,
        "command": " ".join([sys.executable, *sys.argv]),
        "images": images,
        "image_size": list(IMAGE_WH),
        "mean_jpeg_bytes": mean_jpeg_bytes,
        "shards": shards,
        "shard_size": args.shard_size,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
    }


def report(doc: dict[str, Any], where: str, notes: Iterable[str], json_path: str | None) -> None:
    """Print an epoch benchmark's result: a line on the images (``where``: the shards,
    how they are stored), the settings and the load, the :func:`print_table`, then
    ``notes``; and write ``doc`` to ``json_path`` when given."""
    print(
        f"{doc['images']} JPEGs 640x480 ~{doc['mean_jpeg_bytes'] / 1000:.0f} KB{where}; "
        f"{doc['workers']} workers, batch {doc['batch_size']}; "
        f"median [min, max] of {doc['repeats']} interleaved epochs; "
        f"load avg {doc['environment']['loadavg'][0]:.1f}"
    )
    print_table(doc["results"], doc["ratios"])
    for line in notes:
        print(line)
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2))
