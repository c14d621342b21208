"""``run_bench``: measure every tier of one dataset in one run and build the report.

The order is fixed so each tier finds the state it needs: the baseline (first, so
its worker processes fork before any S3 client exists here), the remote ceiling
(ranged GETs, no cache), the cold epoch (fills an empty cache), the warm epochs
(same cache, fresh dataset objects; the first keeps samples in RAM), the RAM
replay, the decode rate, the end-to-end loader over the warm cache, host-to-device
copies, and the baseline. The figures then go through the pure
:func:`fastload.bench.verdict.bottleneck`.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastload.bench.machine import cpu_count, disk_info, machine_info, pil_flavour
from fastload.bench.report import SCHEMA_VERSION
from fastload.bench.tiers import (
    DelayedDecoder,
    TierResult,
    cache_epoch,
    dali_decode_rate,
    decode_rate,
    h2d_bandwidth,
    loader_epoch,
    nvjpeg_decode_rate,
    quiet_inherited_loops,
    ram_replay,
    remote_ceiling,
)
from fastload.bench.verdict import Figures, bottleneck
from fastload.config import FetchConfig, parse_size
from fastload.errors import ConfigError
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS
from fastload.shards.manifest import Manifest, ShardInfo
from fastload.storage import open_store

__all__ = ["DECODE_CHOICES", "BenchSettings", "run_bench", "select_shards"]

DECODE_CHOICES = ("none", "pil", "dali", "nvjpeg")
#: Samples a bench reads when ``max_samples`` is not given (whole shards, so a bit more).
DEFAULT_MAX_SAMPLES = 5000
#: Bytes a bench reads at most when ``max_bytes`` is not given.
DEFAULT_MAX_BYTES = 2 * 10**9


@dataclass(frozen=True)
class BenchSettings:
    """What :func:`run_bench` measures and how.

    ``url``: dataset root (holding ``manifest.json``); ``cache_dir``: the NVMe tier
    (None: an empty temp dir, removed afterwards) and ``cache_limit`` its byte cap
    (None: no cap); ``workers``/``batch_size``: the
    loader's; ``epochs``: warm epochs measured (median reported); ``decode``:
    ``"none"``, ``"pil"``, ``"dali"`` (DALI CPU decode for the decode tier) or
    ``"nvjpeg"`` (torchvision's nvJPEG on the GPU, batched, for the decode tier);
    ``size``: shorter side after decode; ``max_samples``/``max_bytes``: the first
    shards covering this much are read; ``baseline_url``: a prefix with one object
    per sample for the naive per-GET baseline (None: read the shards without the
    cache); ``remote_threads``: parallel GETs of the ceiling; ``decode_delay_s``: a
    what-if sleep added per decoded sample; ``fetch``: part size and concurrency of
    the downloads (None: ``FetchConfig()``); ``prefetch_shards``/``window_shards``:
    the StreamingDataset's; ``progress``: bars on stderr (None: when stderr is a
    terminal).
    """

    url: str
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    workers: int = 2
    batch_size: int = 32
    epochs: int = 2
    decode: str = "pil"
    size: int | None = 224
    max_samples: int | None = None
    max_bytes: int | str | None = None
    baseline_url: str | None = None
    baseline: bool = True
    remote_threads: int = 16
    decode_delay_s: float = 0.0
    fetch: FetchConfig | None = None
    progress: bool | None = None
    prefetch_shards: int = 2
    window_shards: int = DEFAULT_WINDOW_SHARDS

    def __post_init__(self) -> None:
        if self.decode not in DECODE_CHOICES:
            raise ConfigError(f"decode must be one of {DECODE_CHOICES}, got {self.decode!r}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples must be >= 1, got {self.max_samples}")
        if self.size is not None and self.size < 1:
            raise ConfigError(f"size must be >= 1, got {self.size}")
        if self.remote_threads < 1:
            raise ConfigError(f"remote_threads must be >= 1, got {self.remote_threads}")
        if self.decode_delay_s < 0:
            raise ConfigError("decode_delay_s must not be negative")
        if self.prefetch_shards < 0:
            raise ConfigError(f"prefetch_shards must be >= 0, got {self.prefetch_shards}")
        if self.window_shards < 1:
            raise ConfigError(f"window_shards must be >= 1, got {self.window_shards}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON (storage options left out: they may hold secrets)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("storage_options", "fetch")
        }
        fetch = self.fetch or FetchConfig()
        out["fetch"] = {
            "part_size": fetch.part_size,
            "concurrency": fetch.concurrency,
            "parallel_threshold": fetch.parallel_threshold,
        }
        return out


def select_shards(manifest: Manifest, max_samples: int | None, max_bytes: int | None) -> Manifest:
    """The manifest cut to its first shards covering ``max_samples`` samples, without
    exceeding ``max_bytes`` (at least one shard). Cache keys stay those of the full
    dataset, so a cache warmed by the bench serves training."""
    limit_n = DEFAULT_MAX_SAMPLES if max_samples is None else max_samples
    limit_b = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    chosen: list[ShardInfo] = []
    n = b = 0
    for shard in manifest.shards:
        if chosen and (n >= limit_n or b + shard.bytes > limit_b):
            break
        if shard.samples == 0:
            continue
        chosen.append(shard)
        n += shard.samples
        b += shard.bytes
    return dataclasses.replace(manifest, shards=tuple(chosen))


class _Bars:
    """tqdm bars on stderr, one per tier (off when ``enabled`` is False)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    @contextmanager
    def bar(
        self, desc: str, total: int | None, unit: str = "sample"
    ) -> Iterator[Callable[[int], None]]:
        from tqdm import tqdm

        with tqdm(
            total=total,
            desc=desc,
            unit=unit,
            file=sys.stderr,
            disable=not self.enabled,
            leave=False,
            unit_scale=unit == "B",
        ) as t:
            yield t.update


def _image_field(manifest: Manifest) -> str | None:
    from fastload.decode.decoder import IMAGE_EXTENSIONS

    for name in manifest.fields:
        if name.lower().rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
            return name
    return None


def _median_result(results: list[TierResult]) -> TierResult:
    rates = [r.samples_per_s for r in results]
    mid = sorted(results, key=lambda r: r.samples_per_s)[(len(results) - 1) // 2]
    extra = dict(mid.extra)
    extra["remote_bytes"] = max(int(r.extra.get("remote_bytes", 0)) for r in results)
    extra["epochs"] = len(results)
    extra["samples_per_s_by_epoch"] = rates
    extra["spread"] = (
        (max(rates) - min(rates)) / statistics.median(rates) if min(rates) > 0 else 0.0
    )
    return TierResult(mid.samples, mid.bytes, mid.seconds, extra)


def _collate_list(batch: list[Any]) -> list[Any]:
    return batch


def _make_decoder(settings: BenchSettings) -> Any:
    """The per-sample decoder of the loader and the decode tier (None for 'none')."""
    if settings.decode == "none":
        return None
    from fastload.decode import Decoder

    decoder: Any = Decoder(image="tensor", size=settings.size)
    if settings.decode_delay_s > 0:
        decoder = DelayedDecoder(decoder, settings.decode_delay_s)
    return decoder


def run_bench(settings: BenchSettings) -> dict[str, Any]:
    """Measure every tier of the dataset at ``settings.url`` and return the report
    (see :mod:`fastload.bench.report` for its keys).

    Raises :class:`~fastload.errors.StorageError` when the dataset cannot be read,
    :class:`~fastload.errors.ConfigError` for bad settings,
    :class:`~fastload.errors.MissingDependencyError` without torch (or DALI for
    ``decode="dali"``).
    """
    from fastload.datasets.streaming import StreamingDataset
    from fastload.loader.dataloader import DataLoader
    from fastload.sampling import World

    t0 = time.perf_counter()
    bars = _Bars(settings.progress)
    so = dict(settings.storage_options or {})
    fetch = settings.fetch or FetchConfig()
    store = open_store(settings.url, so or None, fetch)
    full = Manifest.from_json(store.read("manifest.json"), settings.url)
    max_bytes = None if settings.max_bytes is None else parse_size(settings.max_bytes, "max_bytes")
    manifest = select_shards(full, settings.max_samples, max_bytes)
    if not manifest.shards:
        raise ConfigError(f"{settings.url}: the dataset has no samples to benchmark")
    data_bytes = manifest.total_bytes
    n_samples = manifest.num_samples
    image_field = _image_field(manifest)
    cache_limit = (
        None if settings.cache_limit is None else parse_size(settings.cache_limit, "cache_limit")
    )
    own_cache = settings.cache_dir is None
    cache_dir = settings.cache_dir or tempfile.mkdtemp(prefix="fastload-bench-")
    notes: list[str] = []
    try:
        machine = machine_info(cache_dir)
        cores = cpu_count()
        world = World.single()

        # 0. the baseline, first: its DataLoader workers fork from a process
        # that holds no S3 clients yet (inherited aiobotocore sessions break at exit)
        baseline_doc: dict[str, Any]
        baseline_res: TierResult | None = None
        if settings.baseline:
            baseline_res = _run_baseline(settings, manifest, n_samples, bars)
            baseline_doc = baseline_res.to_dict()
        else:
            baseline_doc = {"measured": False, "reason": "--no-baseline"}

        # 1. remote ceiling: parallel ranged GETs of the largest shard
        largest = max(manifest.shards, key=lambda s: s.bytes)
        ceiling_store = open_store(settings.url, so or None, fetch)
        with bars.bar("remote ceiling", largest.bytes, "B") as up:
            ceiling = remote_ceiling(
                lambda a, b: ceiling_store.read_range(largest.name, a, b),
                largest.bytes,
                threads=settings.remote_threads,
                progress=up,
            )
        ceiling.extra["shard"] = largest.name
        ceiling.extra["store_requests"] = ceiling_store.stats().requests
        ceiling.extra["retries"] = ceiling_store.stats().retries

        def dataset(shuffle: bool = False, decode: Any = None) -> StreamingDataset:
            # every tier reads the same dataset: the epochs in order and undecoded,
            # the loader shuffled and decoded
            ds = StreamingDataset(
                settings.url,
                shuffle=shuffle,
                cache_dir=cache_dir,
                cache_limit=cache_limit,
                storage_options=so or None,
                world=world,
                fetch=fetch,
                manifest=manifest,
                prefetch_shards=settings.prefetch_shards,
                window_shards=settings.window_shards,
                decode=decode,
            )
            return ds

        # 2. cold epoch through the cache
        ds = dataset()
        try:
            with bars.bar("cold epoch", n_samples) as up:
                cold = cache_epoch(ds, ds.io_stats, progress=up)
        finally:
            ds.close()
        remote_cold = int(cold.extra.get("remote_bytes", 0))
        warm_at_start = remote_cold < 0.5 * data_bytes
        cold.extra["warm_at_start"] = warm_at_start
        if warm_at_start:
            notes.append(
                f"the cache at {cache_dir} was already warm: the 'cold' epoch fetched only "
                f"{remote_cold / 1e6:.1f} MB of {data_bytes / 1e6:.1f} MB from remote"
            )

        # 3. warm epochs from the NVMe tier (fresh dataset objects, same cache dir)
        kept: list[dict[str, Any]] = []
        ram_budget = min(DEFAULT_MAX_BYTES, (machine.get("ram_bytes") or 8 * 10**9) // 4)
        warm_runs = []
        for e in range(settings.epochs):
            ds = dataset()
            try:
                with bars.bar(f"warm epoch {e + 1}", n_samples) as up:
                    warm_runs.append(
                        cache_epoch(
                            ds,
                            ds.io_stats,
                            keep=kept if e == 0 else None,
                            keep_bytes=ram_budget,
                            progress=up,
                        )
                    )
            finally:
                ds.close()
        warm = _median_result(warm_runs)

        # 4. RAM replay: the ceiling of the Python loop
        ram = ram_replay(kept)
        ram.extra["held_samples"] = len(kept)

        # 5. decode rate in this process
        images = [(image_field, bytes(s[image_field])) for s in kept if image_field in s][:500]
        decoder = _make_decoder(settings)
        decode_res: TierResult | None = None
        decode_info: dict[str, Any]
        if settings.decode == "none" or not images:
            decode_info = {
                "measured": False,
                "reason": "--decode none" if settings.decode == "none" else "no image field",
            }
        else:
            with bars.bar(f"decode ({settings.decode})", None, "img") as up:
                if settings.decode == "dali":
                    decode_res = dali_decode_rate(images, settings.size)
                elif settings.decode == "nvjpeg":
                    decode_res = nvjpeg_decode_rate(images, settings.size, settings.batch_size)
                else:
                    decode_res = decode_rate(images, decoder, progress=up)
            decode_info = {
                "measured": True,
                "backend": settings.decode,
                "size": settings.size,
                "field": image_field,
                **decode_res.to_dict(),
            }
            if settings.decode == "pil":
                # which PIL ran (Pillow or Pillow-SIMD) and whose resize, not the setting
                decode_info["pil"] = pil_flavour(decoder)
            if settings.decode_delay_s:
                decode_info["delay_s"] = settings.decode_delay_s

        # 6. end-to-end loader over the warm cache
        loader_decoder = decoder
        if settings.decode in ("dali", "nvjpeg"):
            label = "DALI CPU" if settings.decode == "dali" else "nvJPEG (GPU)"
            notes.append(f"the loader decodes with Pillow: {label} decode is measured on its own")
            loader_decoder = _make_decoder(dataclasses.replace(settings, decode="pil"))
        loader_ds = dataset(shuffle=True, decode=loader_decoder)
        loader = DataLoader(
            loader_ds,
            batch_size=settings.batch_size,
            num_workers=settings.workers,
            collate_fn=_collate_list,
            worker_init_fn=quiet_inherited_loops if settings.workers else None,
        )
        try:
            with bars.bar("loader", n_samples * settings.epochs) as up:
                loader_res, _ = loader_epoch(loader, settings.epochs, progress=up)
        finally:
            loader_ds.close()
        loader_res.extra.update(
            workers=settings.workers,
            batch_size=settings.batch_size,
            decode="pil" if settings.decode in ("dali", "nvjpeg") else settings.decode,
        )
        if loader_decoder is not None:
            loader_res.extra["pil"] = pil_flavour(loader_decoder)

        # 7. host-to-device
        h2d = h2d_bandwidth()

        if baseline_res is not None:
            base = baseline_res.samples_per_s
            baseline_doc["ratios"] = {
                "cold_vs_baseline": cold.samples_per_s / base if base > 0 else None,
                "warm_vs_baseline": warm.samples_per_s / base if base > 0 else None,
            }
        mean_sample = cold.bytes / cold.samples if cold.samples else data_bytes / n_samples
        ceiling_doc = ceiling.to_dict()
        ceiling_doc["samples_per_s"] = ceiling.mb_per_s * 1e6 / mean_sample if mean_sample else 0.0
        figures = Figures(
            dataset_bytes=data_bytes,
            samples=n_samples,
            workers=settings.workers,
            cores=cores,
            remote_ceiling_mb_s=ceiling.mb_per_s,
            cold_sps=None if warm_at_start else cold.samples_per_s,
            cold_mb_s=None if warm_at_start else cold.mb_per_s,
            warm_sps=warm.samples_per_s,
            warm_remote_bytes=int(warm.extra.get("remote_bytes", 0)),
            ram_sps=ram.samples_per_s,
            decode_sps_per_worker=None if decode_res is None else decode_res.samples_per_s,
            decode=settings.decode,
            loader_sps=loader_res.samples_per_s,
            h2d_gb_s=h2d.get("pinned_gb_s"),
            decoded_bytes_per_sample=None
            if decode_res is None  # nvjpeg: only the encoded bytes cross the bus
            else decode_res.extra.get("bus_bytes", decode_res.extra.get("output_bytes")),
            fetch_concurrency=fetch.concurrency,
            prefetch_shards=settings.prefetch_shards,
            cache_limit=cache_limit,
        )
        verdict = bottleneck(figures)
        return {
            "version": SCHEMA_VERSION,
            "settings": settings.to_dict(),
            "machine": machine,
            "dataset": {
                "url": settings.url,
                "shards": len(manifest.shards),
                "shards_total": len(full.shards),
                "samples": n_samples,
                "samples_total": full.num_samples,
                "bytes": data_bytes,
                "bytes_total": full.total_bytes,
                "mean_sample_bytes": mean_sample,
                "fields": list(manifest.fields),
                "image_field": image_field,
                "source": str(full.source.get("kind", "")) if full.source else "",
            },
            "remote": {"ceiling": ceiling_doc, "cold": cold.to_dict()},
            "disk": {
                **warm.to_dict(),
                "cache_dir": cache_dir,
                "temporary": own_cache,
                "device": disk_info(cache_dir),
            },
            "ram": ram.to_dict(),
            "decode": decode_info,
            "loader": loader_res.to_dict(),
            "h2d": h2d,
            "baseline": baseline_doc,
            "bottleneck": verdict.to_dict(),
            "notes": notes,
            "elapsed_s": time.perf_counter() - t0,
        }
    finally:
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)


def _run_baseline(
    settings: BenchSettings, manifest: Manifest, n_samples: int, bars: _Bars
) -> TierResult:
    from fastload.bench.baseline import ObjectsDataset, ShardsDataset, run_baseline

    so = settings.storage_options
    if settings.baseline_url:
        names = open_store(settings.baseline_url, so).list()
        if not names:
            raise ConfigError(f"{settings.baseline_url}: no objects for the per-sample baseline")
        names = names[:n_samples]
        ds: ObjectsDataset | ShardsDataset = ObjectsDataset(settings.baseline_url, names, so)
        desc = "baseline (GET per sample)"
    else:
        ds = ShardsDataset(settings.url, [s.name for s in manifest.shards], so)
        desc = "baseline (shards, no cache)"
    with bars.bar(desc, n_samples) as up:
        return run_baseline(ds, settings.workers, settings.batch_size, progress=up)
