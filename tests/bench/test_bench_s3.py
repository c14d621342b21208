"""``fastload bench`` on a real SeaweedFS: the JSON schema, the plot, counters per
tier, and verdicts that name an artificially slowed tier (decode; the network)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.helpers import S3Dataset
from bench.throttle import ThrottleProxy
from fastload.bench.report import REQUIRED_KEYS, SCHEMA_VERSION, figures_problems
from fastload.cli import main
from support.seaweed import SeaweedServer

TINY = ["--workers", "1", "--epochs", "1", "--batch-size", "8", "--quiet", "--size", "96"]


def _bench(
    capsys: pytest.CaptureFixture[str], url: str, options: str, out: Path, *extra: str
) -> tuple[dict[str, Any], str]:
    rc = main(["bench", url, "--storage-options", options, "--json", str(out), *TINY, *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    stdout = captured.out
    return json.loads(out.read_text()), stdout


def _finite_positive(doc: Any, path: str = "") -> list[str]:
    """Every number in the tiers' figures: positive and finite."""
    bad = []
    for key in ("samples_per_s", "mb_per_s", "seconds"):
        if key in doc and not (math.isfinite(doc[key]) and doc[key] > 0):
            bad.append(f"{path}.{key}={doc[key]}")
    return bad


def test_report_schema_counters_and_plot(
    coco_s3: S3Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "bench.png"
    report, stdout = _bench(
        capsys,
        coco_s3.url,
        coco_s3.options_json,
        tmp_path / "r.json",
        "--baseline-url",
        coco_s3.raw_url,
        "--plot",
        str(png),
    )
    for key in (*REQUIRED_KEYS, "settings", "dataset"):
        assert key in report
    assert report["version"] == SCHEMA_VERSION
    assert figures_problems(report) == []
    for path in ("remote.ceiling", "remote.cold", "disk", "ram", "decode", "loader", "baseline"):
        node: Any = report
        for part in path.split("."):
            node = node[part]
        assert _finite_positive(node, path) == []
    ds = report["dataset"]
    assert ds["samples"] == coco_s3.samples
    assert ds["bytes"] == coco_s3.bytes
    # the counters behind the tiers: cold fetched the dataset, warm fetched nothing
    cold, warm = report["remote"]["cold"], report["disk"]
    assert cold["samples"] == warm["samples"] == coco_s3.samples
    assert coco_s3.bytes <= cold["remote_bytes"] <= coco_s3.bytes * 1.1  # + index sidecars
    assert cold["warm_at_start"] is False
    assert warm["remote_bytes"] == 0
    assert report["ram"]["held_samples"] == coco_s3.samples
    assert report["loader"]["samples"] > 0
    assert report["loader"]["bytes_by_tier"]["remote"] == 0
    assert report["decode"]["measured"] is True
    # the PIL that ran is named, in the JSON and the table, not the --decode setting
    import PIL

    pil = report["decode"]["pil"]
    assert pil["version"] == PIL.__version__ == report["loader"]["pil"]["version"]
    assert pil["library"] == ("Pillow-SIMD" if ".post" in PIL.__version__ else "Pillow")
    assert f"decode ({pil['library']}, 1 process)" in stdout
    assert f"PIL (decode and loader rows): {pil['library']} {pil['version']}" in stdout
    assert report["h2d"]["available"] in (True, False)
    base = report["baseline"]
    assert base["kind"] == "objects"
    assert base["samples"] == coco_s3.samples
    assert base["requests"] == coco_s3.samples
    assert all(v > 0 for v in base["ratios"].values())
    # nothing secret in the report
    assert coco_s3.storage_options["secret"] not in json.dumps(report)
    # the table and the verdict on stdout
    assert "warm epoch (NVMe cache)" in stdout
    assert "fastload vs baseline:" in stdout
    assert "bottleneck: " + report["bottleneck"]["summary"] in stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_a_given_warm_cache_dir_is_reported_warm(
    coco_s3: S3Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    args = ("--cache-dir", str(cache), "--no-baseline", "--decode", "none")
    first, _ = _bench(capsys, coco_s3.url, coco_s3.options_json, tmp_path / "1.json", *args)
    second, stdout = _bench(capsys, coco_s3.url, coco_s3.options_json, tmp_path / "2.json", *args)
    assert first["remote"]["cold"]["warm_at_start"] is False
    assert second["remote"]["cold"]["warm_at_start"] is True
    assert second["remote"]["cold"]["remote_bytes"] == 0
    assert "cache was warm" in stdout
    assert "already warm" in stdout
    assert second["decode"]["measured"] is False
    assert second["baseline"]["measured"] is False
    assert figures_problems(second) == []
    assert cache.is_dir()  # a given cache dir is not removed


def test_slow_decode_is_named(
    coco_s3: S3Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 250 ms per image: one worker decodes < 4 img/s, far below the local store and the
    # cache even on a loaded machine (where the cold epoch of 24 samples, client start-up
    # included, was seen at 10 samples/s: a 60 ms delay let it win)
    report, stdout = _bench(
        capsys, coco_s3.url, coco_s3.options_json, tmp_path / "r.json", "--decode-delay-ms", "250"
    )
    verdict = report["bottleneck"]
    assert verdict["kind"] == "decode-bound", verdict
    assert report["decode"]["samples_per_s"] < 4.1
    assert "decode-bound: 1 worker decodes" in stdout
    assert report["baseline"]["kind"] == "shards"  # no --baseline-url: shards without cache
    assert report["baseline"]["samples"] == coco_s3.samples


def test_slow_network_is_named(
    coco_s3: S3Dataset,
    seaweed: SeaweedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit = 1_000_000  # bytes/s
    with ThrottleProxy(("127.0.0.1", seaweed.s3_port), limit) as proxy:
        options = json.dumps(dict(coco_s3.storage_options, endpoint_url=proxy.endpoint_url))
        report, stdout = _bench(
            capsys,
            coco_s3.url,
            options,
            tmp_path / "r.json",
            "--no-baseline",
            "--remote-threads",
            "4",
        )
        moved = proxy.bytes_down
    verdict = report["bottleneck"]
    assert verdict["kind"] == "network-bound", verdict
    assert "network-bound" in stdout
    assert "fastload cache warm" in stdout
    cold = report["remote"]["cold"]
    assert cold["mb_per_s"] < 1.3  # the proxy's limit (plus its burst) holds
    assert cold["remote_bytes"] >= coco_s3.bytes
    assert moved >= 2 * coco_s3.bytes * 0.5
    assert report["disk"]["samples_per_s"] > 10 * cold["samples_per_s"]


def test_a_cache_smaller_than_the_data_is_named(
    coco_s3: S3Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastload.cache.disk import DiskTier

    assert coco_s3.shards >= 3
    # the cap counts the cache's own metadata too: that, plus about two shards of three
    # or more; one shard open at a time so that readers' pins leave room
    probe = DiskTier(tmp_path / "probe")
    meta = probe.metadata_bytes(least=True)
    probe.close()
    limit = str(meta + 64 * 1024 + 5 * coco_s3.bytes // coco_s3.shards // 2)
    report, stdout = _bench(
        capsys, coco_s3.url, coco_s3.options_json, tmp_path / "r.json",
        "--cache-limit", limit, "--decode", "none", "--no-baseline",
        "--window-shards", "1", "--prefetch-shards", "0",
    )  # fmt: skip
    assert report["bottleneck"]["kind"] == "cache-too-small", report["bottleneck"]
    assert report["disk"]["remote_bytes"] > 0.1 * coco_s3.bytes  # the warm epoch refetched
    assert "cache too small" in stdout
    assert "cache_limit" in stdout
    assert report["settings"]["cache_limit"] == limit
