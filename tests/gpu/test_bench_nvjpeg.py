"""`fastload bench --decode nvjpeg`: the decode tier on the GPU and what the verdict makes
of it (the verdict is a pure function; the tier needs torchvision's image extension:
``tests/gpu/tv_io.py``)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from bench.helpers import BASE
from decode.images import encode, photo_like
from fastload.bench.runner import BenchSettings
from fastload.bench.tiers import nvjpeg_decode_rate
from fastload.bench.verdict import bottleneck
from fastload.errors import MissingDependencyError
from gpu.tv_io import needs_torchvision_io


def test_cpu_decode_advice_names_both_gpu_decoders() -> None:
    v = bottleneck(BASE)
    assert v.kind == "decode-bound"
    gpu = [a for a in v.advice if "NvjpegDecoder" in a]
    assert len(gpu) == 1
    assert "DALI" in gpu[0]
    assert "--decode nvjpeg" in gpu[0]


def test_nvjpeg_decode_is_one_gpu_rate_not_scaled_by_workers() -> None:
    v = bottleneck(replace(BASE, decode="nvjpeg", decode_sps_per_worker=900.0, loader_sps=800.0))
    assert v.stages["decode"] == pytest.approx(900.0)  # not x 4 workers
    assert v.kind == "decode-bound"
    assert "nvJPEG on the GPU decodes 900 img/s" in v.summary
    assert not any("num_workers" in a for a in v.advice)
    assert not any("--decode nvjpeg" in a or "use DALI" in a for a in v.advice)
    assert not any("draft" in a for a in v.advice)  # Pillow's advice does not apply
    assert any("batch" in a for a in v.advice)


def test_with_nvjpeg_the_bus_carries_the_encoded_bytes() -> None:
    # 25 GB/s over 150 KB of decoded pixels = 166k samples/s; over 110 KB encoded more
    f = replace(BASE, decode="nvjpeg", h2d_gb_s=25.0, decoded_bytes_per_sample=110e3)
    assert bottleneck(f).stages["h2d"] == pytest.approx(25e9 / 110e3)


def test_bench_settings_accept_nvjpeg() -> None:
    assert BenchSettings("s3://b/x", decode="nvjpeg").decode == "nvjpeg"


def _jpegs(n: int) -> list[tuple[str, bytes]]:
    return [("jpg", encode(photo_like(96, 64, seed=i), "JPEG", quality=90)) for i in range(n)]


def test_the_tier_without_torchvision_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(MissingDependencyError, match=r"fastload\[gpu\]"):
        nvjpeg_decode_rate(_jpegs(2), size=32)


@needs_torchvision_io
def test_the_tier_decodes_every_image_and_counts_the_bytes() -> None:
    images = _jpegs(10)
    r = nvjpeg_decode_rate(images, size=32, batch_size=4, min_seconds=0.0)
    assert r.samples >= 10
    assert r.samples % 4 == 0
    assert r.samples_per_s > 0
    assert r.extra["fallbacks"] == 0
    encoded = sum(len(b) for _, b in images) / len(images)
    assert r.extra["bus_bytes"] == pytest.approx(encoded, rel=0.3)
    # 96x64 -> shorter side 32: 48x32 x 3 channels
    assert r.extra["output_bytes"] == pytest.approx(48 * 32 * 3)
