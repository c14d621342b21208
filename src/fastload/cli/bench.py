"""``fastload bench URL``: measure every tier of a dataset and name the bottleneck.

One run measures the store's ranged-GET ceiling, a cold epoch through the cache, warm
epochs from the NVMe tier, a replay from RAM, the decode rate, the end-to-end loader,
host-to-device copies and a baseline, then prints a table and a verdict (stdout);
``--json FILE`` writes the versioned report, ``--plot FILE.png`` a bar chart.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastload.cli.common import HelpFormatter, add_storage_options, parse_storage_options

__all__ = ["add_bench_options", "emit", "register", "run", "settings_from_args"]

_DESCRIPTION = (
    "Measure, in one run, the store's parallel ranged-GET ceiling, a cold epoch through "
    "the cache, warm epochs from the NVMe tier, a replay from RAM, the decode rate, the "
    "end-to-end fastload.DataLoader, host-to-device copies and a baseline without "
    "fastload; print a table and the bottleneck with settings to try."
)


def _default_workers() -> int:
    from fastload.config import default_workers

    return default_workers("bench")


def add_bench_options(p: argparse.ArgumentParser) -> None:
    """The options ``bench`` and ``demo`` share (loader, decode, output)."""
    p.add_argument(
        "--cache-dir",
        default=None,
        help="NVMe cache directory; unset: an empty temp dir, removed afterwards",
    )
    p.add_argument(
        "--cache-limit",
        default=None,
        help="byte cap of the cache, e.g. 400GB (unset: no cap)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=_default_workers(),
        help="DataLoader workers (and baseline workers)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="loader batch size")
    p.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="warm epochs measured for the cache and the loader (median reported)",
    )
    p.add_argument(
        "--decode",
        choices=("none", "pil", "dali", "nvjpeg"),
        default="pil",
        help="decoder for the decode tier and the loader (dali: DALI CPU decode; nvjpeg: "
        "torchvision's nvJPEG on the GPU, batched, for the decode tier)",
    )
    p.add_argument(
        "--size", type=int, default=224, help="shorter image side after decode (0: no resize)"
    )
    p.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="read the first shards covering this many samples (unset: 5000)",
    )
    p.add_argument(
        "--max-bytes",
        default=None,
        help="read at most this many bytes of shards, e.g. 2GB (unset: 2GB)",
    )
    p.add_argument(
        "--remote-threads", type=int, default=16, help="parallel ranged GETs for the remote ceiling"
    )
    p.add_argument(
        "--fetch-concurrency",
        type=int,
        default=16,
        help="parallel ranged GETs per shard download (FetchConfig.concurrency)",
    )
    p.add_argument(
        "--part-size",
        default="16MiB",
        help="bytes per ranged GET of a download, e.g. 8MiB (FetchConfig.part_size)",
    )
    p.add_argument(
        "--prefetch-shards",
        type=int,
        default=2,
        help="shards each reader fetches ahead (StreamingDataset prefetch_shards)",
    )
    p.add_argument(
        "--window-shards",
        type=int,
        default=8,
        help="shards shuffled together by the loader (StreamingDataset window_shards)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the baseline")
    p.add_argument(
        "--decode-delay-ms",
        type=float,
        default=0.0,
        help="what-if: add this many ms to every decoded sample",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw a bar chart here")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser(
        "bench",
        help="measure every tier (remote, cache, RAM, decode, loader) and name the bottleneck",
        description=_DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    p.add_argument("url", metavar="URL", help="dataset root (holding manifest.json)")
    p.add_argument(
        "--baseline-url",
        default=None,
        metavar="URL",
        help="a prefix with one object per sample: baseline = one GET per sample "
        "(default: read the shards without the cache)",
    )
    add_storage_options(p)
    add_bench_options(p)
    p.set_defaults(func=run)


def settings_from_args(
    args: argparse.Namespace, url: str, storage_options: Any, baseline_url: str | None
) -> Any:
    """The :class:`~fastload.bench.runner.BenchSettings` the parsed options ask for."""
    from fastload.bench.runner import BenchSettings
    from fastload.config import FetchConfig

    return BenchSettings(
        url=url,
        storage_options=storage_options,
        cache_dir=args.cache_dir,
        cache_limit=args.cache_limit,
        workers=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        decode=args.decode,
        size=args.size or None,
        max_samples=args.max_samples,
        max_bytes=args.max_bytes,
        baseline_url=baseline_url,
        baseline=not args.no_baseline,
        remote_threads=args.remote_threads,
        decode_delay_s=args.decode_delay_ms / 1e3,
        progress=False if args.quiet else None,
        fetch=FetchConfig(part_size=args.part_size, concurrency=args.fetch_concurrency),
        prefetch_shards=args.prefetch_shards,
        window_shards=args.window_shards,
    )


def emit(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the table and verdict on stdout; write ``--json`` and ``--plot`` files."""
    from fastload.bench.report import render_table, write_json

    print(render_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"report: {args.json}", file=sys.stderr)
    if args.plot:
        from fastload.bench.plot import plot_report

        plot_report(report, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0."""
    from fastload.bench.runner import run_bench

    so = parse_storage_options(args.storage_options)
    from fastload.cli.bench_tokens import is_token_dataset, run_tokens

    if is_token_dataset(args.url, so):
        return run_tokens(args, so)
    report = run_bench(settings_from_args(args, args.url, so, args.baseline_url))
    emit(report, args)
    return 0
