"""The bottleneck verdict: each rule triggered by synthetic figures (a pure function)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from bench.helpers import BASE, MB
from fastload.bench.verdict import VERDICT_KINDS, Figures, bottleneck
from fastload.config import format_size


def test_decode_bound_names_the_rates_and_suggests_workers_and_dali() -> None:
    v = bottleneck(BASE)
    assert v.kind == "decode-bound"
    assert "4 workers decode 1,200 img/s" in v.summary
    assert "warm cache gives 20,000 img/s" in v.summary
    assert any("num_workers" in a and "8 cores" in a for a in v.advice)
    assert any("DALI" in a for a in v.advice)
    assert v.stages["decode"] == pytest.approx(1200.0)


def test_decode_bound_suggests_the_pixel_tier_with_its_size() -> None:
    v = bottleneck(replace(BASE, decoded_bytes_per_sample=150_528.0))
    tier = [a for a in v.advice if "pixel_cache=True" in a]
    assert len(tier) == 1
    need = format_size(150_528.0 * BASE.samples)
    assert f"~{need} of cache for these {BASE.samples:,} samples" in tier[0]
    assert "pixel_cache" not in " ".join(bottleneck(replace(BASE, decode="nvjpeg")).advice)


def test_decode_bound_with_all_cores_busy_does_not_suggest_more_workers() -> None:
    v = bottleneck(replace(BASE, workers=8, cores=8, loader_sps=2300.0))
    assert v.kind == "decode-bound"
    assert any("already uses the 8 cores" in a for a in v.advice)
    assert not any(a.startswith("raise num_workers") for a in v.advice)


def test_decode_bound_with_dali_does_not_suggest_dali_again() -> None:
    v = bottleneck(replace(BASE, decode="dali"))
    assert v.kind == "decode-bound"
    assert not any("use DALI" in a for a in v.advice)


def test_network_bound_below_the_ceiling_suggests_concurrency() -> None:
    f = replace(
        BASE, cold_sps=400.0, cold_mb_s=40.0, remote_ceiling_mb_s=900.0, fetch_concurrency=8
    )
    v = bottleneck(f)
    assert v.kind == "network-bound"
    assert "400 samples/s (40.0 MB/s)" in v.summary
    assert any("FetchConfig.concurrency (now 8; bench: --fetch-concurrency)" in a for a in v.advice)
    assert any("fastload cache warm" in a for a in v.advice)
    assert any("from epoch 2" in a for a in v.advice)


def test_network_bound_at_the_ceiling_says_the_link_is_the_limit() -> None:
    f = replace(BASE, cold_sps=400.0, cold_mb_s=40.0, remote_ceiling_mb_s=45.0)
    v = bottleneck(f)
    assert v.kind == "network-bound"
    assert any("at the store's ceiling" in a for a in v.advice)
    assert not any("reaches" in a and "ceiling" in a for a in v.advice)


def test_cache_too_small_when_the_warm_epoch_refetches() -> None:
    v = bottleneck(replace(BASE, warm_remote_bytes=60 * MB))
    assert v.kind == "cache-too-small"
    assert "fetched 60.0 MB of the 100.0 MB dataset" in v.summary
    assert any("cache_limit to at least 110 MB" in a for a in v.advice)


def test_cache_too_small_when_the_cap_is_below_the_data() -> None:
    v = bottleneck(replace(BASE, cache_limit=50 * MB))
    assert v.kind == "cache-too-small"
    assert "cache_limit 50.0 MB" in v.summary


def test_a_little_refetching_is_not_a_small_cache() -> None:
    assert bottleneck(replace(BASE, warm_remote_bytes=1 * MB)).kind == "decode-bound"


def test_disk_bound_suggests_nvme_and_the_page_cache() -> None:
    f = replace(BASE, warm_sps=900.0, decode_sps_per_worker=3000.0, loader_sps=850.0)
    v = bottleneck(f)
    assert v.kind == "disk-bound"
    assert any("NVMe" in a for a in v.advice)
    assert any("page cache" in a for a in v.advice)


def test_h2d_bound_when_copies_carry_the_fewest_samples() -> None:
    # 0.5 GB/s over 600 KB decoded samples: ~833 samples/s, below decode's 1,200
    f = replace(BASE, h2d_gb_s=0.5, decoded_bytes_per_sample=600_000.0, loader_sps=800.0)
    v = bottleneck(f)
    assert v.kind == "h2d-bound"
    assert any("device='cuda'" in a for a in v.advice)


def test_loader_bound_when_the_loader_falls_far_short_of_every_stage() -> None:
    v = bottleneck(replace(BASE, loader_sps=200.0))
    assert v.kind == "loader-bound"
    assert "17% of what its narrowest stage (decode" in v.summary
    assert any("batch_size" in a for a in v.advice)


def test_loader_bound_notes_a_slow_first_epoch() -> None:
    v = bottleneck(replace(BASE, loader_sps=200.0, cold_sps=700.0))
    assert v.kind == "loader-bound"
    assert any("first epoch" in n for n in v.notes)


def test_balanced_when_the_two_slowest_stages_are_close() -> None:
    v = bottleneck(replace(BASE, cold_sps=1250.0, cold_mb_s=125.0))
    assert v.kind == "balanced"
    assert "network" in v.summary
    assert "decode" in v.summary


def test_missing_figures_give_insufficient_data() -> None:
    f = Figures(dataset_bytes=0, samples=0, workers=1, cores=1)
    assert bottleneck(f).kind == "insufficient-data"


def test_unmeasured_stages_are_left_out() -> None:
    f = replace(BASE, decode_sps_per_worker=None, loader_sps=None, cold_sps=None, cold_mb_s=None)
    v = bottleneck(f)
    assert set(v.stages) == {"disk"}
    assert v.kind == "disk-bound"


def test_every_verdict_is_json_and_of_a_known_kind() -> None:
    variants = [
        BASE,
        replace(BASE, warm_remote_bytes=60 * MB),
        replace(BASE, cold_sps=100.0, cold_mb_s=10.0),
        replace(BASE, loader_sps=10.0),
        replace(BASE, decode_sps_per_worker=float("nan")),
    ]
    for f in variants:
        d = bottleneck(f).to_dict()
        assert d["kind"] in VERDICT_KINDS
        assert json.loads(json.dumps(d)) == d


def test_a_store_slower_than_the_loader_is_named_before_a_loader_shortfall() -> None:
    v = bottleneck(replace(BASE, cold_sps=100.0, cold_mb_s=10.0, loader_sps=300.0))
    assert v.kind == "network-bound"
    assert any("from the warm cache the loader makes 300 samples/s" in n for n in v.notes)


def test_decode_alone_is_decode_bound_without_a_supply_figure() -> None:
    f = Figures(dataset_bytes=1, samples=1, workers=2, cores=2, decode_sps_per_worker=50.0)
    v = bottleneck(f)
    assert v.kind == "decode-bound"
    assert "while" not in v.summary


def test_workers_beyond_the_cores_add_no_decode_capacity() -> None:
    v = bottleneck(replace(BASE, workers=16, cores=2, loader_sps=590.0))
    assert v.stages["decode"] == pytest.approx(600.0)  # 2 cores x 300
    assert v.kind == "decode-bound"
    assert any("already uses the 2 cores" in a for a in v.advice)


def test_no_workers_means_the_main_process_decodes() -> None:
    v = bottleneck(replace(BASE, workers=0, loader_sps=290.0))
    assert v.kind == "decode-bound"
    assert v.summary.startswith("decode-bound: the main process decodes")
    assert any("(now 0; bench: --workers)" in a for a in v.advice)


# every knob the advice may name, and the bench option that sets it
_KNOB_FLAGS = {
    "FetchConfig.concurrency": "--fetch-concurrency",
    "FetchConfig.part_size": "--part-size",
    "prefetch_shards": "--prefetch-shards",
    "window_shards": "--window-shards",
    "num_workers": "--workers",
    "batch_size": "--batch-size",
    "cache_limit": "--cache-limit",
    "cache_dir": "--cache-dir",
    "size=": "--size",
}


def _all_advice() -> list[str]:
    variants = [
        BASE,
        replace(BASE, warm_remote_bytes=60 * MB),
        replace(BASE, cache_limit=10 * MB),
        replace(BASE, cold_sps=400.0, cold_mb_s=40.0, remote_ceiling_mb_s=900.0),
        replace(BASE, cold_sps=400.0, cold_mb_s=40.0, remote_ceiling_mb_s=45.0),
        replace(BASE, loader_sps=10.0),
        replace(BASE, warm_sps=900.0, decode_sps_per_worker=3000.0, loader_sps=880.0),
        replace(BASE, workers=16, cores=2, loader_sps=590.0),
        replace(BASE, cold_sps=1250.0, cold_mb_s=125.0, loader_sps=1190.0),
        replace(BASE, h2d_gb_s=0.001, decoded_bytes_per_sample=1e6, loader_sps=1.0),
    ]
    kinds = set()
    out: list[str] = []
    for f in variants:
        v = bottleneck(f)
        kinds.add(v.kind)
        out += [*v.advice, *v.notes]
    assert kinds >= set(VERDICT_KINDS) - {"insufficient-data"}, kinds
    return out


def test_every_setting_the_advice_names_has_a_bench_flag() -> None:
    import argparse

    from fastload.cli.bench import add_bench_options

    parser = argparse.ArgumentParser()
    add_bench_options(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for line in _all_advice():
        for flag in re.findall(r"--[a-z][a-z-]+", line):
            assert flag in flags, (flag, line)
        for knob, flag in _KNOB_FLAGS.items():
            if knob in line:
                assert flag in line, (knob, line)
