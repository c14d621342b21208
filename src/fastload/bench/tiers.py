"""One measurement per tier: remote ceiling, cache epochs, RAM replay, decode, loader, H2D.

Each function does the work it names once (or until a minimum time has passed,
for the fast ones) and returns a :class:`TierResult`: samples, bytes, seconds and
whatever counters explain the figure. Nothing here decides what the figures mean;
:mod:`fastload.bench.verdict` does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import MissingDependencyError

__all__ = [
    "DelayedDecoder",
    "TierResult",
    "cache_epoch",
    "dali_decode_rate",
    "decode_rate",
    "h2d_bandwidth",
    "loader_epoch",
    "nvjpeg_decode_rate",
    "quiet_inherited_loops",
    "ram_replay",
    "read_sample",
    "remote_ceiling",
    "sample_bytes",
]

Progress = Callable[[int], None]


@dataclass(frozen=True)
class TierResult:
    """What one tier did: ``samples`` and ``bytes`` in ``seconds`` (wall time), plus
    ``extra`` counters (JSON-serialisable)."""

    samples: int
    bytes: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        """Samples per second (0 when nothing was timed)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10^6) per second (0 when nothing was timed)."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """``samples``, ``bytes``, ``seconds``, ``samples_per_s``, ``mb_per_s`` and the
        extra counters, as one JSON-serialisable dict."""
        out: dict[str, Any] = {
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "samples_per_s": self.samples_per_s,
            "mb_per_s": self.mb_per_s,
        }
        out.update(self.extra)
        return out


def sample_bytes(sample: dict[str, Any]) -> int:
    """Bytes of a raw sample's fields (``__key__`` and other ``__`` entries excluded).
    Counts only: it does not read them (see :func:`read_sample`)."""
    total = 0
    for k, v in sample.items():
        if not k.startswith("__") and isinstance(v, (bytes, bytearray, memoryview)):
            total += memoryview(v).nbytes
    return total


_MASK64 = (1 << 64) - 1


def read_sample(sample: dict[str, Any]) -> tuple[int, int]:
    """Read every byte of a raw sample's fields, as a consumer of them would.

    Returns ``(bytes, checksum)``: the bytes counted (as :func:`sample_bytes`) and the
    sum of the fields' xxh3-64 digests mod 2^64. Hashing runs at memory speed and
    must load each byte, so a tier that counts bytes this way has touched them all
    (a length lookup alone would "read" any amount in no time)."""
    import xxhash

    total = digest = 0
    for k, v in sample.items():
        if not k.startswith("__") and isinstance(v, (bytes, bytearray, memoryview)):
            view = memoryview(v)
            total += view.nbytes
            digest = (digest + xxhash.xxh3_64_intdigest(view)) & _MASK64
    return total, digest


# ----------------------------------------------------------------------- remote
def remote_ceiling(
    read_range: Callable[[int, int], bytes],
    size: int,
    threads: int = 16,
    part_size: int | None = None,
    min_seconds: float = 1.0,
    max_passes: int = 20,
    progress: Progress | None = None,
) -> TierResult:
    """Read an object of ``size`` bytes as parallel ranged GETs (``read_range(start,
    end)``) on ``threads`` threads, whole passes until ``min_seconds`` have passed
    or ``max_passes`` were made (after an untimed warm-up of one tiny GET per
    thread, so client and connection set-up are not counted). ``part_size``
    defaults to one part per thread (at least 1 MiB, so per-request overhead does
    not dominate; at most 16 MiB). Returns the bytes read."""
    if size <= 0:
        return TierResult(0, 0, 0.0, {"threads": threads, "passes": 0})
    if part_size is None:
        part_size = min(16 << 20, max(1 << 20, math.ceil(size / threads)))
    parts = [(s, min(s + part_size, size)) for s in range(0, size, part_size)]
    got = 0
    passes = 0

    def one(span: tuple[int, int]) -> int:
        n = len(read_range(*span))
        if progress is not None:
            progress(n)
        return n

    workers = min(threads, len(parts))
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-get") as pool:
        # untimed: the client and one connection per thread are made here, not timed
        list(pool.map(lambda _: read_range(0, 1), range(workers)))
        start = time.perf_counter()
        while passes < max_passes:
            got += sum(pool.map(one, parts))
            passes += 1
            if time.perf_counter() - start >= min_seconds:
                break
        seconds = time.perf_counter() - start
    return TierResult(
        0,
        got,
        seconds,
        {
            "threads": threads,
            "part_size": part_size,
            "passes": passes,
            "requests": passes * len(parts),
        },
    )


# ------------------------------------------------------------------------ cache
def cache_epoch(
    samples: Iterable[dict[str, Any]],
    io_stats: Callable[[], dict[str, int]],
    keep: list[dict[str, Any]] | None = None,
    keep_bytes: int = 0,
    progress: Progress | None = None,
) -> TierResult:
    """Iterate ``samples`` (a dataset's epoch of raw samples), reading every field's
    bytes (:func:`read_sample`), and count what ``io_stats()`` (the dataset's
    counters) says moved.

    With ``keep``, samples are appended to it while their total stays under
    ``keep_bytes`` (for the RAM replay). ``extra`` has ``remote_bytes``,
    ``disk_bytes``, ``ram_bytes``, ``cache_hits``, ``cache_misses`` of the epoch and
    ``checksum``, the sum of the samples' :func:`read_sample` checksums mod 2^64."""
    before = dict(io_stats())
    n = total = kept = checksum = 0
    start = time.perf_counter()
    for sample in samples:
        b, digest = read_sample(sample)
        checksum = (checksum + digest) & _MASK64
        n += 1
        total += b
        if keep is not None and kept + b <= keep_bytes:
            keep.append(sample)
            kept += b
        if progress is not None:
            progress(1)
    seconds = time.perf_counter() - start
    after = io_stats()
    delta: dict[str, Any] = {k: int(after.get(k, 0) - before.get(k, 0)) for k in after}
    delta["checksum"] = checksum
    return TierResult(n, total, seconds, delta)


def ram_replay(samples: Sequence[dict[str, Any]], min_seconds: float = 0.2) -> TierResult:
    """Iterate samples already in RAM for whole passes until ``min_seconds``, reading
    every byte of every field (:func:`read_sample`) as the Python loop of a training
    job consumes them: the ceiling of any loader feeding this loop (the "replay from
    RAM" of spdl's benchmarks), bounded by memory bandwidth (or the CPU caches, for
    samples that fit in them). ``extra`` has ``passes`` and ``checksum``, that of
    one pass (the sum of the samples' checksums mod 2^64)."""
    if not samples:
        return TierResult(0, 0, 0.0, {"passes": 0, "checksum": 0})
    n = total = passes = checksum = 0
    start = time.perf_counter()
    while True:
        checksum = 0
        for sample in samples:
            b, digest = read_sample(sample)
            checksum = (checksum + digest) & _MASK64
            total += b
            n += 1
        passes += 1
        if time.perf_counter() - start >= min_seconds or passes >= 1000:
            break
    return TierResult(
        n, total, time.perf_counter() - start, {"passes": passes, "checksum": checksum}
    )


# ----------------------------------------------------------------------- decode
def decode_rate(
    images: Sequence[tuple[str, bytes]],
    decoder: Callable[[dict[str, Any]], Any],
    min_seconds: float = 1.0,
    max_images: int = 2000,
    progress: Progress | None = None,
) -> TierResult:
    """Decode ``images`` (``(field, bytes)`` pairs) with ``decoder`` (called with
    ``{"__key__": ..., field: bytes}``) in this process, cycling until ``min_seconds``
    have passed or ``max_images`` were decoded (at least each image once).
    ``extra["output_bytes"]`` is the mean size of a decoded image."""
    if not images:
        return TierResult(0, 0, 0.0, {"output_bytes": 0})
    n = total = out_bytes = 0
    start = time.perf_counter()
    i = 0
    while True:
        name, data = images[i % len(images)]
        out = decoder({"__key__": f"bench{i}", name: data})
        out_bytes += _nbytes(out.get(name) if isinstance(out, dict) else out)
        n += 1
        total += len(data)
        i += 1
        if progress is not None:
            progress(1)
        if i >= len(images) and (time.perf_counter() - start >= min_seconds or i >= max_images):
            break
    seconds = time.perf_counter() - start
    return TierResult(n, total, seconds, {"output_bytes": out_bytes / n})


def _nbytes(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return memoryview(value).nbytes
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    numel = getattr(value, "numel", None)
    if callable(numel):
        return int(numel()) * int(getattr(value, "element_size", lambda: 1)())
    size = getattr(value, "size", None)
    mode = getattr(value, "mode", None)
    if isinstance(size, tuple) and len(size) == 2 and isinstance(mode, str):  # a PIL image
        return int(size[0]) * int(size[1]) * len(mode)
    return 0


def dali_decode_rate(
    images: Sequence[tuple[str, bytes]],
    size: int | None,
    batch_size: int = 32,
    threads: int = 1,
    min_seconds: float = 1.0,
    max_images: int = 2000,
) -> TierResult:
    """Decode ``images`` with a DALI CPU pipeline (``fn.decoders.image`` on the CPU,
    then a shorter-side resize to ``size``) on ``threads`` DALI threads.
    Raises :class:`MissingDependencyError` without DALI."""
    try:
        import numpy as np
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as exc:
        raise MissingDependencyError("nvidia-dali-cuda120", "dali", "--decode dali") from exc
    if not images:
        return TierResult(0, 0, 0.0, {"output_bytes": 0})
    encoded = [np.frombuffer(data, dtype=np.uint8) for _, data in images]
    state = {"i": 0}

    def source() -> list[Any]:
        batch = [encoded[(state["i"] + j) % len(encoded)] for j in range(batch_size)]
        state["i"] += batch_size
        return batch

    make_pipeline: Any = pipeline_def  # its stubs do not admit device_id=None (CPU only)

    @make_pipeline(batch_size=batch_size, num_threads=threads, device_id=None)
    def pipe() -> Any:
        jpegs: Any = fn.external_source(source=source, dtype=types.DALIDataType.UINT8)
        imgs: Any = fn.decoders.image(jpegs, device="cpu", output_type=types.DALIImageType.RGB)
        if size:
            imgs = fn.resize(imgs, resize_shorter=size)
        return imgs

    p = pipe()
    p.build()
    p.run()  # warm-up: the first run allocates
    n = out_bytes = total = 0
    sizes = [len(d) for _, d in images]
    start = time.perf_counter()
    while True:
        (out,) = p.run()
        for j in range(len(out)):
            out_bytes += int(np.asarray(out.at(j)).nbytes)
        total += sum(sizes[(n + j) % len(sizes)] for j in range(batch_size))
        n += batch_size
        if n >= len(images) and (time.perf_counter() - start >= min_seconds or n >= max_images):
            break
    seconds = time.perf_counter() - start
    del p
    return TierResult(n, total, seconds, {"output_bytes": out_bytes / n, "dali_threads": threads})


def nvjpeg_decode_rate(
    images: Sequence[tuple[str, bytes]],
    size: int | None,
    batch_size: int = 32,
    min_seconds: float = 1.0,
    max_images: int = 2000,
) -> TierResult:
    """Decode ``images`` in batches with :class:`fastload.decode.gpu.NvjpegDecoder`
    (torchvision's nvJPEG on the GPU, or its CPU decoder where there is no CUDA), then a
    shorter-side resize to ``size`` on the same device. ``extra["bus_bytes"]`` is what
    crosses to the GPU per sample (the encoded bytes). Raises
    :class:`MissingDependencyError` without torchvision."""
    import torch

    from fastload.decode.gpu import NvjpegDecoder, torchvision_io
    from fastload.packed import PackedBytes

    torchvision_io()
    if not images:
        return TierResult(0, 0, 0.0, {"output_bytes": 0})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    decoder = NvjpegDecoder(size or None, device=device, resize="shorter")
    data = [d for _, d in images]
    batches = []
    for first in range(0, len(data), batch_size):
        packed = PackedBytes.from_list([data[(first + j) % len(data)] for j in range(batch_size)])
        batches.append(packed.pin_memory() if device == "cuda" else packed)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    decoder.decode_field(batches[0])  # warm-up: nvJPEG handles, the allocator
    sync()
    n = total = out_bytes = 0
    start = time.perf_counter()
    while True:
        packed = batches[(n // batch_size) % len(batches)]
        out = decoder.decode_field(packed)
        if n < len(data):
            out_bytes += sum(int(t.numel()) for t in out)
        total += packed.nbytes
        n += batch_size
        if n >= len(data) and (time.perf_counter() - start >= min_seconds or n >= max_images):
            break
    sync()
    seconds = time.perf_counter() - start
    decoded = min(n, -(-len(data) // batch_size) * batch_size)
    return TierResult(
        n,
        total,
        seconds,
        {
            "output_bytes": out_bytes / decoded,
            "bus_bytes": total / n,
            "device": device,
            "batch_size": batch_size,
            "fallbacks": decoder.fallbacks,
        },
    )


# ----------------------------------------------------------------------- loader
def loader_epoch(
    loader: Any, epochs: int = 1, progress: Progress | None = None
) -> tuple[TierResult, list[float]]:
    """Iterate ``epochs`` epochs of a :class:`fastload.DataLoader` (batches are lists of
    samples or tensors) and return the total result and each epoch's samples/s.

    Rates are steady state: each epoch is timed from its first batch on (the wait
    for the first batch, worker start-up, is ``extra["first_batch_s"]``).

    ``extra`` holds the loader's ``stats()`` figures: ``wait_fraction`` (time the
    consumer waited / wall time), ``wait_p50_s``, ``wait_p95_s``,
    ``first_wait_s``, ``bytes_by_tier``, ``cache_hit_ratio``."""
    per_epoch: list[float] = []
    first_batch: list[float] = []
    n = 0
    seconds = 0.0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        count = after_first = 0
        start = time.perf_counter()
        t_first = start
        for batch in _batches(loader):
            size = len(batch) if isinstance(batch, list) else _batch_len(batch)
            if count == 0:
                t_first = time.perf_counter()
                first_batch.append(t_first - start)
            else:
                after_first += size
            count += size
            if progress is not None:
                progress(size)
        end = time.perf_counter()
        # Steady state: from the first batch on (worker start-up is reported apart),
        # unless the epoch was a single batch.
        if after_first and end > t_first:
            took, got = end - t_first, after_first
        else:
            took, got = end - start, count
        per_epoch.append(got / took if took > 0 else 0.0)
        n += got
        seconds += took
    st = loader.stats()
    wall = st.wall_time_s
    extra = {
        "wait_fraction": (st.wait_total_s / wall) if wall > 0 else None,
        "wait_p50_s": st.wait_p50_s,
        "wait_p95_s": st.wait_p95_s,
        "first_wait_s": st.first_wait_s,
        "bytes_by_tier": dict(st.bytes_by_tier),
        "cache_hit_ratio": st.cache_hit_ratio,
        "epochs": epochs,
        "samples_per_s_by_epoch": per_epoch,
        "first_batch_s": first_batch,
    }
    total_bytes = int(sum(st.bytes_by_tier.values())) if st.bytes_by_tier else 0
    return TierResult(n, total_bytes, seconds, extra), per_epoch


def _batches(loader: Any) -> Iterator[Any]:
    yield from loader


def _batch_len(batch: Any) -> int:
    try:
        return len(batch)
    except TypeError:
        return 1


# -------------------------------------------------------------------------- h2d
def h2d_bandwidth(nbytes: int = 64 << 20, repeats: int = 10) -> dict[str, Any]:
    """Host-to-device copy bandwidth in GB/s from pinned and pageable memory, or
    ``{"available": False, "reason": ...}`` without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    try:
        if not torch.cuda.is_available():
            return {
                "available": False,
                "reason": "no CUDA device (torch.cuda.is_available() is False)",
            }
    except Exception as exc:  # a broken driver is "absent", not a failed benchmark
        return {"available": False, "reason": f"CUDA unusable: {exc}"}
    out: dict[str, Any] = {
        "available": True,
        "bytes": nbytes,
        "repeats": repeats,
        "device": torch.cuda.get_device_name(0),
    }
    dev = torch.device("cuda", 0)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    for kind, pinned in (("pinned", True), ("pageable", False)):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        src.fill_(1)
        dst.copy_(src, non_blocking=pinned)  # warm-up
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
        out[f"{kind}_gb_s"] = nbytes * repeats / seconds / 1e9
    return out


def quiet_inherited_loops(worker_id: int = 0) -> None:
    """``worker_init_fn`` for benchmark DataLoaders: silence asyncio's "Task exception
    was never retrieved" in a forked worker. A parent whose s3fs sessions were closing
    when it forked leaves their half-done tasks in the child, which reports them at
    exit although nothing in the child failed."""
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class DelayedDecoder:
    """A decoder that sleeps ``delay_s`` per sample before calling ``inner``: a what-if
    knob ("decode N ms slower") that shows how the verdict and the loader respond.
    Picklable (into DataLoader workers) when ``inner`` is."""

    inner: Callable[[dict[str, Any]], Any]
    delay_s: float

    def __call__(self, sample: dict[str, Any]) -> Any:
        """Sleep, then decode ``sample`` with ``inner``."""
        time.sleep(self.delay_s)
        return self.inner(sample)
