"""The bottleneck verdict: a pure function from measured figures to a diagnosis.

:func:`bottleneck` looks at what each stage of the pipeline can supply, in samples
per second, and names the narrowest one with concrete settings to try. It does no
I/O and reads no clock, so every rule is unit-tested with synthetic figures.

Stages compared (``None`` = not measured, left out):

* ``network``: the cold epoch through the cache (what the first epoch gets);
* ``disk``: the warm epoch from the NVMe cache (what later epochs get);
* ``decode``: one process's decode rate times the loader's workers (at most one
  per core); with ``decode="nvjpeg"`` the one GPU's rate as measured;
* ``h2d``: host-to-device bandwidth over the decoded bytes per sample (the encoded
  bytes with nvjpeg, which decodes on the GPU);
* and the end-to-end ``loader`` over the warm cache, which should reach the
  narrowest of those; when it falls well short, the loader itself is the limit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fastload.config import format_size

__all__ = ["VERDICT_KINDS", "Figures", "Verdict", "bottleneck"]

#: Every kind :func:`bottleneck` can return.
VERDICT_KINDS: tuple[str, ...] = (
    "cache-too-small",
    "network-bound",
    "disk-bound",
    "decode-bound",
    "h2d-bound",
    "loader-bound",
    "balanced",
    "insufficient-data",
)

# A stage is "the" bottleneck when the next one is at least this much faster.
_MARGIN = 1.15
# The loader is its own bottleneck when it reaches less than this share of the
# narrowest stage it depends on.
_LOADER_SHORTFALL = 0.5
# A warm epoch that fetches more than this share of the data again means eviction.
_REFETCH_SHARE = 0.10
# The cache fill is "far below the ceiling" under this share of the ranged-GET rate.
_FILL_VS_CEILING = 0.5


@dataclass(frozen=True)
class Figures:
    """What the verdict needs, in samples/s and bytes (``None``: not measured).

    ``remote_ceiling_mb_s`` is the parallel ranged-GET rate of the store;
    ``cold_sps``/``cold_mb_s`` the cold epoch through the cache; ``warm_sps`` the
    warm epoch; ``warm_remote_bytes`` what the warm epoch still fetched remotely;
    ``ram_sps`` the replay-from-RAM ceiling; ``decode_sps_per_worker`` one
    process's decode rate and ``workers`` the loader's worker count; ``loader_sps``
    the end-to-end loader; ``h2d_gb_s`` the pinned host-to-device bandwidth and
    ``decoded_bytes_per_sample`` the size of a decoded sample; ``cores`` the CPUs.
    """

    dataset_bytes: int
    samples: int
    workers: int
    cores: int
    remote_ceiling_mb_s: float | None = None
    cold_sps: float | None = None
    cold_mb_s: float | None = None
    warm_sps: float | None = None
    warm_remote_bytes: int | None = None
    ram_sps: float | None = None
    decode_sps_per_worker: float | None = None
    decode: str = "pil"
    loader_sps: float | None = None
    h2d_gb_s: float | None = None
    decoded_bytes_per_sample: float | None = None
    cache_limit: int | None = None
    fetch_concurrency: int = 16
    prefetch_shards: int = 2


@dataclass(frozen=True)
class Verdict:
    """The diagnosis: ``kind`` (one of :data:`VERDICT_KINDS`), a one-line
    ``summary``, ``advice`` (concrete settings to try), the ``stages`` compared
    (samples/s) and further ``notes``."""

    kind: str
    summary: str
    advice: tuple[str, ...] = ()
    stages: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        out = asdict(self)
        out["advice"] = list(self.advice)
        out["notes"] = list(self.notes)
        return out


def _ok(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def _n(x: float) -> str:
    """A rate for people: ``1,150`` or ``12.5``."""
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _mb(x: float) -> str:
    return f"{x:,.0f} MB/s" if x >= 100 else f"{x:,.1f} MB/s"


def _parallel(f: Figures) -> int:
    """Worker processes that can decode at once: the workers, at most one per core."""
    workers = max(1, f.workers)  # num_workers=0: the main process decodes
    return min(workers, f.cores) if f.cores > 0 else workers


def _stages(f: Figures) -> dict[str, float]:
    stages: dict[str, float] = {}
    if f.cold_sps is not None and _ok(f.cold_sps):
        stages["network"] = float(f.cold_sps)
    if f.warm_sps is not None and _ok(f.warm_sps):
        stages["disk"] = float(f.warm_sps)
    if f.decode_sps_per_worker is not None and _ok(f.decode_sps_per_worker):
        # workers beyond the cores share them: they add no decode throughput; nvjpeg
        # decodes on the one GPU for the whole process
        scale = 1 if f.decode == "nvjpeg" else _parallel(f)
        stages["decode"] = float(f.decode_sps_per_worker) * scale
    h2d, per_sample = f.h2d_gb_s, f.decoded_bytes_per_sample
    if h2d is not None and per_sample is not None and _ok(h2d) and _ok(per_sample):
        stages["h2d"] = float(h2d) * 1e9 / float(per_sample)
    return stages


def _cache_too_small(f: Figures, stages: dict[str, float]) -> Verdict | None:
    refetched = (
        f.warm_remote_bytes is not None
        and f.dataset_bytes > 0
        and (f.warm_remote_bytes > _REFETCH_SHARE * f.dataset_bytes)
    )
    capped = f.cache_limit is not None and f.cache_limit < f.dataset_bytes
    if not (refetched or capped):
        return None
    mb = f.dataset_bytes / 1e6
    if refetched:
        what = (
            f"the warm epoch fetched {(f.warm_remote_bytes or 0) / 1e6:,.1f} MB of the "
            f"{mb:,.1f} MB dataset from remote again"
        )
    else:
        limit = f.cache_limit or 0
        what = f"cache_limit {limit / 1e6:,.1f} MB is below the {mb:,.1f} MB read per epoch"
    advice = (
        f"raise cache_limit to at least {mb * 1.1:,.0f} MB (dataset plus 10%; bench: "
        "--cache-limit), or point cache_dir (--cache-dir) at a larger NVMe volume",
        "with several nodes, each node reads only its 1/N share: a cache of "
        "dataset/N per node suffices",
        "or use StreamingDataset(shuffle=True) with a small window_shards (bench: "
        "--window-shards), which keeps only a few shards cached at once",
    )
    return Verdict("cache-too-small", f"cache too small: {what}", advice, stages)


def _network(f: Figures, stages: dict[str, float], consumer: float) -> Verdict:
    cold = stages["network"]
    cold_mb = f.cold_mb_s or 0.0
    summary = (
        f"network-bound: the store delivers {_n(cold)} samples/s ({_mb(cold_mb)}) through "
        f"the cache while the rest of the pipeline could take {_n(consumer)} samples/s"
    )
    advice: list[str] = []
    ceiling = f.remote_ceiling_mb_s if _ok(f.remote_ceiling_mb_s) else None
    if ceiling is not None and cold_mb < _FILL_VS_CEILING * ceiling:
        advice.append(
            f"the cache fill reaches {cold_mb / ceiling:.0%} of the store's ranged-GET "
            f"ceiling ({_mb(ceiling)}): raise FetchConfig.concurrency (now "
            f"{f.fetch_concurrency}; bench: --fetch-concurrency) and prefetch_shards (now "
            f"{f.prefetch_shards}; --prefetch-shards), or lower FetchConfig.part_size "
            "(--part-size) so more parts of a shard download at once"
        )
    elif ceiling is not None:
        advice.append(
            f"the cache fill is at the store's ceiling ({_mb(ceiling)}): the link or the "
            "store is the limit; raise FetchConfig.concurrency (--fetch-concurrency) or "
            "lower FetchConfig.part_size (--part-size) only if the store scales with more "
            "connections"
        )
    advice.append(
        "pre-stage the dataset before training with `fastload cache warm URL "
        "--cache-dir DIR`: from then on every epoch reads the NVMe tier"
    )
    if "disk" in stages:
        advice.append(
            f"from epoch 2 the cache serves {_n(stages['disk'])} samples/s: the limit "
            "applies to the first epoch (and to datasets larger than the cache)"
        )
    return Verdict("network-bound", summary, tuple(advice), stages)


def _decode(f: Figures, stages: dict[str, float], supply: float, supplier: str) -> Verdict:
    rate = stages["decode"]
    per = f.decode_sps_per_worker or 0.0
    workers = max(1, f.workers)
    who = f"{workers} worker{'s' if workers != 1 else ''}" if f.workers else "the main process"
    if _parallel(f) < workers:
        who += f" on {f.cores} cores"
    verb = "decode" if f.workers > 1 else "decodes"
    summary = f"decode-bound: {who} {verb} {_n(rate)} img/s ({_n(per)} per process)"
    if f.decode == "nvjpeg":
        summary = f"decode-bound: nvJPEG on the GPU decodes {_n(rate)} img/s"
    if supply > 0:
        summary += f" while the {supplier} gives {_n(supply)} img/s"
    advice: list[str] = []
    if f.decode == "nvjpeg":
        advice.append(
            "decode larger batches per nvJPEG call (bench: --batch-size), or decode on "
            "several GPUs (one NvjpegDecoder per rank)"
        )
    elif workers < f.cores:
        advice.append(
            f"raise num_workers towards the {f.cores} cores (now {f.workers}; bench: "
            "--workers): decode scales with processes"
        )
    else:
        advice.append(
            f"num_workers ({workers}; bench: --workers) already uses the {f.cores} cores: "
            "more workers will not help; decode elsewhere"
        )
    if f.decode not in ("dali", "nvjpeg"):
        tier = ""
        if _ok(f.decoded_bytes_per_sample):
            need = float(f.decoded_bytes_per_sample or 0.0) * f.samples
            tier = f" (~{format_size(need)} of cache for these {f.samples:,} samples at this size)"
        advice.append(
            "training for more than one epoch: keep the decoded pixels in the node cache, "
            "ShardedDataset(url, cache_dir=..., decode='tensor', size=..., pixel_cache=True)"
            f"{tier}: from epoch 2 no image is decoded (docs/howto-pixels.md; bench: "
            "--cache-dir and --size set the first two)"
        )
        advice.append(
            "use DALI on the GPU (fastload.dali.pipeline(url, device='gpu'), nvJPEG), or "
            "without DALI torchvision's nvJPEG (fastload.decode.gpu.NvjpegDecoder; bench: "
            "--decode nvjpeg), to take JPEG decoding off the CPU"
        )
    if f.decode != "nvjpeg":  # Pillow's draft mode and SIMD resizes
        advice.append(
            "decode smaller: keep Decoder(draft=True) and a small size= (bench: --size; JPEG "
            "draft mode decodes at 1/2, 1/4 or 1/8 scale); install Pillow-SIMD for faster "
            "resizes"
        )
    return Verdict("decode-bound", summary, tuple(advice), stages)


def _disk(f: Figures, stages: dict[str, float], consumer: float) -> Verdict:
    warm = stages["disk"]
    summary = (
        f"disk-bound: the warm cache gives {_n(warm)} samples/s while decode and the rest "
        f"could take {_n(consumer)} samples/s"
    )
    advice = [
        "put cache_dir (bench: --cache-dir) on local NVMe (not a network or overlay file system)",
    ]
    ram = f.ram_sps if _ok(f.ram_sps) else None
    if ram is not None and ram > _MARGIN * warm:
        advice.append(
            f"the same samples replay from RAM at {_n(ram)} samples/s: the NVMe tier is "
            "served through the page cache, so leave RAM free for it (smaller worker "
            "footprints), or put the cache directory on a faster disk"
        )
    advice.append(
        "read with more DataLoader workers (--workers) so several shards are mapped and "
        "read at once"
    )
    return Verdict("disk-bound", summary, tuple(advice), stages)


def _h2d(f: Figures, stages: dict[str, float], consumer: float) -> Verdict:
    rate = stages["h2d"]
    summary = (
        f"h2d-bound: host-to-device copies carry {_n(rate)} samples/s "
        f"({f.h2d_gb_s:.1f} GB/s) while the loader makes {_n(consumer)} samples/s"
    )
    advice = (
        "feed batches with fastload.DataLoader(device='cuda') so they are pinned and copied "
        "on a side stream one batch ahead",
        "send uint8 images and convert to float on the GPU (4x fewer bytes than float32)",
        "or decode on the GPU with DALI (fastload.dali.pipeline(device='gpu')): only "
        "compressed bytes cross the bus",
    )
    return Verdict("h2d-bound", summary, advice, stages)


def bottleneck(f: Figures) -> Verdict:
    """Name the narrowest stage of the pipeline described by ``f``, with advice.

    Rules, in order: a warm epoch that refetches (or a cap below the data) is
    ``cache-too-small``; a cold epoch clearly (15%) slower than every other stage
    and than the measured loader is ``network-bound``; a loader reaching under
    half of its narrowest warm stage is ``loader-bound``; two slowest stages within
    15% of each other are ``balanced``; otherwise the slowest of disk, decode and
    h2d names the verdict. Returns :class:`Verdict`; never raises.
    """
    stages = _stages(f)
    small = _cache_too_small(f, stages)
    if small is not None:
        return small
    if not stages:
        return Verdict(
            "insufficient-data",
            "no verdict: no tier produced a measurement",
            ("run with more samples (--max-samples) so every tier is measured",),
            stages,
        )
    ranked = sorted(stages.items(), key=lambda kv: kv[1])
    slowest, slow_rate = ranked[0]
    notes: list[str] = []
    loader = f.loader_sps if f.loader_sps is not None and _ok(f.loader_sps) else None

    clear = len(ranked) == 1 or ranked[1][1] >= _MARGIN * slow_rate
    # The loader runs over the warm cache: compare it to the stages it depends on.
    steady = {k: v for k, v in stages.items() if k != "network"}
    shortfall: tuple[str, float] | None = None
    if loader is not None and steady:
        s_name, s_rate = min(steady.items(), key=lambda kv: kv[1])
        if loader < _LOADER_SHORTFALL * s_rate:
            shortfall = (s_name, s_rate)

    # A store slower than everything, the measured loader included, binds first.
    if slowest == "network" and clear and (loader is None or _MARGIN * slow_rate < loader):
        consumer = min([v for _, v in ranked[1:]] + ([loader] if loader is not None else []))
        verdict = _network(f, stages, consumer)
        if shortfall is not None and loader is not None:
            notes.append(
                f"from the warm cache the loader makes {_n(loader)} samples/s, "
                f"{loader / shortfall[1]:.0%} of its narrowest stage ({shortfall[0]}): raise "
                "batch_size or num_workers (--batch-size, --workers)"
            )
        return dataclasses.replace(verdict, notes=tuple(notes))

    if shortfall is not None and loader is not None:  # loader is set when shortfall is
        s_name, s_rate = shortfall
        summary = (
            f"loader-bound: the end-to-end loader makes {_n(loader)} samples/s, "
            f"{loader / s_rate:.0%} of what its narrowest stage ({s_name}, "
            f"{_n(s_rate)} samples/s) supplies"
        )
        advice = [
            "raise batch_size (bench: --batch-size; per-batch overhead: collation, IPC, pickling)",
            "return tensors from workers, not bytes: tensors cross processes in shared "
            "memory, pickled bytes are copied",
        ]
        if f.ram_sps is not None and _ok(f.ram_sps):
            advice.append(
                f"the Python loop over samples held in RAM reaches {_n(f.ram_sps)} "
                "samples/s: a loader far below it spends its time in transport"
            )
        if f.workers < f.cores:
            advice.append(
                f"raise num_workers towards the {f.cores} cores (now {f.workers}; --workers)"
            )
        if "network" in stages and stages["network"] < s_rate:
            notes.append(
                f"the first epoch is also limited by the network "
                f"({_n(stages['network'])} samples/s)"
            )
        return Verdict("loader-bound", summary, tuple(advice), stages, tuple(notes))

    if not clear:
        names = " and ".join(f"{k} ({_n(v)} samples/s)" for k, v in ranked[:2])
        return Verdict(
            "balanced",
            f"balanced: {names} are within 15% of each other; no single stage limits",
            (
                "speeding up one stage alone gains little; raise num_workers and the fetch "
                "concurrency together (--workers, --fetch-concurrency), or move decode to "
                "the GPU",
            ),
            stages,
        )
    consumer = ranked[1][1] if len(ranked) > 1 else slow_rate
    if loader is not None:
        consumer = min(consumer, loader)
    if slowest == "network":
        return _network(f, stages, max(consumer, slow_rate))
    if slowest == "disk":
        return _disk(f, stages, ranked[1][1] if len(ranked) > 1 else slow_rate)
    if slowest == "h2d":
        return _h2d(f, stages, ranked[1][1] if len(ranked) > 1 else slow_rate)
    if "disk" in stages:
        return _decode(f, stages, stages["disk"], "warm cache")
    return _decode(f, stages, stages.get("network", 0.0), "store")
