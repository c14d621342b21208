"""``fastload bench`` says which decoder ``decode_crop`` runs: native, Pillow or
Pillow-SIMD (in ``pil_flavour``'s record and the table's PIL line)."""

from __future__ import annotations

from typing import Any

import pytest

from fastload import _native
from fastload.bench.machine import crop_decoder_name, pil_flavour
from fastload.bench.report import render_table
from fastload.decode import backend_info
from fastload.decode.crop import CROP_DECODER_ENV

STOCK = {"library": "Pillow", "version": "13.0.0", "libjpeg_turbo": True, "resizer": "torch"}


def _tier(sps: float) -> dict[str, Any]:
    return {"samples": 10, "bytes": 10**6, "seconds": 1.0, "samples_per_s": sps, "mb_per_s": 1.0}


def _report(pil: dict[str, Any]) -> dict[str, Any]:
    """A bench report whose decode and loader rows ran with ``pil``."""
    return {
        "dataset": {"url": "s3://b/x", "samples": 10, "shards": 1, "shards_total": 1, "bytes": 1},
        "machine": {"image_backend": {"library": "Pillow", "version": "1.0.0"}},
        "remote": {"ceiling": dict(_tier(900), threads=16), "cold": _tier(100)},
        "disk": _tier(5000),
        "ram": dict(_tier(10**5), held_samples=10),
        "decode": dict(_tier(300), measured=True, backend="pil", size=224, pil=pil),
        "loader": dict(_tier(250), workers=2, decode="pil", batch_size=32, pil=pil),
        "h2d": {"available": False, "reason": "no CUDA device"},
        "baseline": {"measured": False},
        "bottleneck": {"kind": "decode-bound", "summary": "decode-bound: x", "advice": []},
        "notes": [],
    }


def test_the_crop_decoder_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CROP_DECODER_ENV, raising=False)
    native = getattr(_native, "HAVE_JPEG", False)
    library = backend_info()["library"]
    assert crop_decoder_name() == ("native" if native else library)
    flavour = pil_flavour()
    assert flavour is not None
    assert flavour["crop_decoder"] == crop_decoder_name()
    monkeypatch.setenv(CROP_DECODER_ENV, "pillow")  # forced: Pillow (or Pillow-SIMD)
    assert crop_decoder_name() == library
    assert pil_flavour()["crop_decoder"] == library


@pytest.mark.parametrize("crops", ["native", "Pillow-SIMD"])
def test_the_table_names_the_crop_decoder(crops: str) -> None:
    table = render_table(_report(dict(STOCK, crop_decoder=crops)))
    line = "PIL (decode and loader rows): Pillow 13.0.0 with libjpeg-turbo, resized by torch"
    assert f"{line}; crops decoded by {crops}" in table.splitlines()
