"""``fastload bench`` names the PIL that decoded (stock Pillow or Pillow-SIMD, its
version, whose resize), not the ``--decode pil`` setting: in the JSON report
(``decode.pil``, ``loader.pil``) and in the table (row labels and a ``PIL`` line)."""

from __future__ import annotations

from typing import Any

import PIL
import pytest

from fastload.bench.machine import pil_flavour
from fastload.bench.report import pil_used, render_table, tier_rows
from fastload.decode import Decoder


def _tier(sps: float) -> dict[str, Any]:
    return {"samples": 10, "bytes": 10**6, "seconds": 1.0, "samples_per_s": sps, "mb_per_s": 1.0}


def _report(pil: dict[str, Any] | None, decode: str = "pil") -> dict[str, Any]:
    decode_doc = dict(_tier(300), measured=True, backend=decode, size=224)
    loader = dict(_tier(250), workers=2, decode="pil", batch_size=32)
    if pil is not None:
        if decode == "pil":
            decode_doc["pil"] = pil
        loader["pil"] = pil
    return {
        "dataset": {"url": "s3://b/x", "samples": 10, "shards": 1, "shards_total": 1, "bytes": 1},
        "machine": {"image_backend": {"library": "Pillow", "version": "1.0.0"}},
        "remote": {"ceiling": dict(_tier(900), threads=16), "cold": _tier(100)},
        "disk": _tier(5000),
        "ram": dict(_tier(10**5), held_samples=10),
        "decode": decode_doc,
        "loader": loader,
        "h2d": {"available": False, "reason": "no CUDA device"},
        "baseline": {"measured": False},
        "bottleneck": {"kind": "decode-bound", "summary": "decode-bound: x", "advice": []},
        "notes": [],
    }


SIMD = {"library": "Pillow-SIMD", "version": "9.5.0.post1", "libjpeg_turbo": True,
        "resizer": "Pillow-SIMD"}  # fmt: skip
STOCK = {"library": "Pillow", "version": "13.0.0", "libjpeg_turbo": True, "resizer": "torch"}


@pytest.mark.parametrize("pil", [SIMD, STOCK], ids=["pillow-simd", "pillow"])
def test_rows_name_the_pil_that_ran(pil: dict[str, Any]) -> None:
    report = _report(pil)
    labels = [label for label, _ in tier_rows(report)]
    assert f"decode ({pil['library']}, 1 process)" in labels
    assert f"loader (2 workers, {pil['library']})" in labels
    assert not any("pil" in label for label in labels)  # the setting's name is gone
    table = render_table(report)
    resize = "torch" if pil["resizer"] == "torch" else pil["library"]
    line = f"PIL (decode and loader rows): {pil['library']} {pil['version']} with libjpeg-turbo"
    assert f"{line}, resized by {resize}" in table.splitlines()
    assert pil_used(report, "decode") == pil_used(report, "loader") == pil


def test_the_loader_row_names_pil_when_the_decode_row_is_dali() -> None:
    report = _report(SIMD, decode="dali")
    labels = [label for label, _ in tier_rows(report)]
    assert "decode (dali, 1 process)" in labels
    assert "loader (2 workers, Pillow-SIMD)" in labels
    assert "PIL (loader rows): Pillow-SIMD 9.5.0.post1" in render_table(report)


def test_reports_without_the_record_fall_back_to_the_machine_facts() -> None:
    report = _report(None)
    assert pil_used(report, "decode") == {"library": "Pillow", "version": "1.0.0"}
    assert "decode (Pillow, 1 process)" in [label for label, _ in tier_rows(report)]
    del report["machine"]
    assert "decode (pil, 1 process)" in [label for label, _ in tier_rows(report)]


def test_pil_flavour_is_the_pil_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = Decoder(image="tensor", size=224)  # what the bench's decode tier uses
    got = pil_flavour(decoder)
    assert got is not None
    simd = ".post" in PIL.__version__
    assert got["library"] == ("Pillow-SIMD" if simd else "Pillow")
    assert got["version"] == PIL.__version__
    # decode="tensor" resizes with torch's kernels on stock Pillow, with Pillow-SIMD's
    assert got["resizer"] == ("Pillow-SIMD" if simd else "torch")
    assert pil_flavour(Decoder(image="tensor", size=224, resizer="pil"))["resizer"] in (
        "Pillow",
        "Pillow-SIMD",
    )
    assert "resizer" not in pil_flavour(Decoder(image="tensor"))  # nothing resized
    # Pillow-SIMD is told apart by its version's .postN suffix (what backend_info reads)
    monkeypatch.setattr(PIL, "__version__", "9.5.0.post1")
    assert pil_flavour(decoder) == {
        "library": "Pillow-SIMD",
        "version": "9.5.0.post1",
        "libjpeg_turbo": got["libjpeg_turbo"],
        "crop_decoder": got["crop_decoder"],
        "resizer": "Pillow-SIMD",
    }
