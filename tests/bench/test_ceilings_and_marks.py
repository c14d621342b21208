"""Ceilings read every byte they count; the table explains waits and marks the
bottleneck row; the plot draws it; the CLI has the flags the advice names."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import xxhash

from fastload.bench.report import bottleneck_labels, bottleneck_stages, render_table
from fastload.bench.tiers import cache_epoch, ram_replay, read_sample
from fastload.config import FetchConfig
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS

REPO = Path(__file__).resolve().parents[2]
MASK = (1 << 64) - 1


def _samples() -> list[dict[str, Any]]:
    return [
        {"__key__": f"{i}", "jpg": bytes([i % 251]) * (1000 + i), "json": memoryview(b"{}")}
        for i in range(20)
    ]


def _expected(samples: list[dict[str, Any]]) -> int:
    total = 0
    for s in samples:
        for k, v in s.items():
            if not k.startswith("__"):
                total = (total + xxhash.xxh3_64_intdigest(bytes(v))) & MASK
    return total


def test_read_sample_hashes_every_field() -> None:
    sample = {"__key__": "k", "a": b"xyz", "b": bytearray(b"12345"), "n": 3}
    n, digest = read_sample(sample)
    assert n == 8
    assert digest == (xxhash.xxh3_64_intdigest(b"xyz") + xxhash.xxh3_64_intdigest(b"12345")) & MASK


def test_ram_replay_reads_every_byte_it_counts() -> None:
    samples = _samples()
    r = ram_replay(samples, min_seconds=0.0)
    assert r.extra["passes"] >= 1
    assert r.bytes == r.extra["passes"] * sum(1002 + i for i in range(20))
    assert r.extra["checksum"] == _expected(samples)
    # the last byte of the last sample is part of the figure: changing it shows
    changed = [*samples[:-1], dict(samples[-1], jpg=samples[-1]["jpg"][:-1] + b"\x00")]
    assert ram_replay(changed, min_seconds=0.0).extra["checksum"] != r.extra["checksum"]


def test_cache_epoch_reads_every_byte_it_counts() -> None:
    samples = _samples()
    r = cache_epoch(iter(samples), dict)
    assert r.extra["checksum"] == _expected(samples)


def _report(kind: str, stages: dict[str, float], wait: float | None = 0.97) -> dict[str, Any]:
    def tier(sps: float) -> dict[str, Any]:
        return {
            "samples": 10,
            "bytes": 10**6,
            "seconds": 1.0,
            "samples_per_s": sps,
            "mb_per_s": 1.0,
        }

    return {
        "dataset": {"url": "s3://b/x", "samples": 10, "shards": 1, "shards_total": 1, "bytes": 1},
        "remote": {"ceiling": dict(tier(900), threads=16), "cold": tier(100)},
        "disk": tier(5000),
        "ram": dict(tier(10**5), held_samples=10),
        "decode": dict(tier(300), measured=True, backend="pil", size=224),
        "loader": dict(tier(250), workers=2, decode="pil", batch_size=32, wait_fraction=wait,
                       wait_p50_s=0.0123),
        "h2d": {"available": True, "pinned_gb_s": 12.0, "pageable_gb_s": 6.0},
        "baseline": {"measured": False},
        "bottleneck": {"kind": kind, "summary": f"{kind}: x", "advice": [], "stages": stages},
        "notes": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "stage", "label"),
    [
        ("network-bound", "network", "cold epoch (cache fill)"),
        ("disk-bound", "disk", "warm epoch (NVMe cache)"),
        ("cache-too-small", "disk", "warm epoch (NVMe cache)"),
        ("decode-bound", "decode", "decode (pil, 1 process)"),
        ("loader-bound", "loader", "loader (2 workers, pil)"),
    ],
)
def test_the_table_marks_the_bottleneck_row(kind: str, stage: str, label: str) -> None:
    report = _report(kind, {"network": 100.0, "disk": 5000.0, "decode": 600.0})
    assert bottleneck_stages(report) == [stage]
    assert bottleneck_labels(report) == [label]
    marked = [line for line in render_table(report).splitlines() if "<- bottleneck" in line]
    assert len(marked) == 1
    assert marked[0].startswith(label)


def test_h2d_balanced_and_no_verdict_marks() -> None:
    h2d = _report("h2d-bound", {"h2d": 50.0})
    (line,) = [ln for ln in render_table(h2d).splitlines() if "<- bottleneck" in ln]
    assert line.startswith("host-to-device")
    balanced = _report("balanced", {"network": 100.0, "disk": 5000.0, "decode": 110.0})
    assert bottleneck_stages(balanced) == ["network", "decode"]
    assert len([ln for ln in render_table(balanced).splitlines() if "<- bottleneck" in ln]) == 2
    assert bottleneck_stages(_report("insufficient-data", {})) == []


def test_the_table_explains_the_wait() -> None:
    table = render_table(_report("decode-bound", {"decode": 600.0}))
    assert "loop waited 97% of wall (12.3 ms/batch median) [1]" in table
    assert "[1] wait: the share of the loader's wall time the consuming loop spent blocked" in table
    assert "[1] wait" not in render_table(_report("decode-bound", {}, wait=None))


def test_the_plot_draws_the_bottleneck(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fastload.bench.plot import plot_report

    out = tmp_path / "bench.png"
    assert plot_report(_report("decode-bound", {"decode": 600.0}), out) == [
        "decode (pil, 1 process)"
    ]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h2d = _report("h2d-bound", {"h2d": 50.0})
    assert plot_report(h2d, tmp_path / "h2d.png") == ["host-to-device (pinned)"]
    stored = json.loads((REPO / "docs" / "bench-demo.json").read_text())
    assert plot_report(stored, tmp_path / "demo.png") == bottleneck_labels(stored)


def test_the_flags_reach_the_settings_with_the_library_defaults() -> None:
    from fastload.cli.bench import add_bench_options, settings_from_args

    parser = argparse.ArgumentParser()
    add_bench_options(parser)
    defaults = settings_from_args(parser.parse_args([]), "s3://b/x", None, None)
    assert defaults.fetch == FetchConfig()
    assert defaults.prefetch_shards == 2
    assert defaults.window_shards == DEFAULT_WINDOW_SHARDS
    args = parser.parse_args(
        ["--fetch-concurrency", "4", "--part-size", "8MiB", "--prefetch-shards", "5",
         "--window-shards", "3"]
    )  # fmt: skip
    s = settings_from_args(args, "s3://b/x", None, None)
    assert (s.fetch.concurrency, s.fetch.part_size) == (4, 8 << 20)
    assert (s.prefetch_shards, s.window_shards) == (5, 3)
    assert s.to_dict()["fetch"]["concurrency"] == 4
