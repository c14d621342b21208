"""The benchmark report: a versioned JSON document and its table for people.

Schema version 1, top-level keys (:data:`REQUIRED_KEYS`):

* ``version`` (int), ``settings``, ``machine``, ``dataset``;
* ``remote``: ``{"ceiling": tier, "cold": tier}`` — parallel ranged GETs of the
  largest shard (``samples_per_s`` there is the equivalent in mean-size samples)
  and the cold epoch through the cache (``remote_bytes`` fetched, ``warm_at_start``);
* ``disk``: the warm epoch from the NVMe tier (median of the epochs, ``remote_bytes``);
* ``ram``: the replay-from-RAM ceiling; ``decode``: one process's decode rate
  (``measured`` False with ``--decode none``); ``loader``: the end-to-end
  ``fastload.DataLoader`` (``wait_fraction`` ...); ``h2d``: ``available`` and GB/s;
  ``decode.pil`` and ``loader.pil`` (where they decoded with PIL): the PIL that ran
  (:func:`fastload.bench.machine.pil_flavour`: ``library`` Pillow or Pillow-SIMD,
  ``version``, ``libjpeg_turbo``, ``resizer``), which the table's labels name;
* ``baseline``: the same-run baseline (``kind`` ``objects`` or ``shards``) with
  ``ratios`` of fastload's cold and warm epoch rates to it (``cold_vs_baseline``,
  ``warm_vs_baseline``);
* ``bottleneck``: the :class:`~fastload.bench.verdict.Verdict` as a dict.

A *tier* is ``{"samples", "bytes", "seconds", "samples_per_s", "mb_per_s", ...}``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = [
    "REQUIRED_KEYS",
    "SCHEMA_VERSION",
    "STAGE_ROWS",
    "TIER_ROWS",
    "bottleneck_labels",
    "bottleneck_stages",
    "figures_problems",
    "pil_used",
    "render_table",
    "tier_rows",
    "write_json",
]

SCHEMA_VERSION = 1
REQUIRED_KEYS: tuple[str, ...] = (
    "version",
    "settings",
    "machine",
    "dataset",
    "remote",
    "disk",
    "ram",
    "decode",
    "loader",
    "h2d",
    "baseline",
    "bottleneck",
)

#: (label, path in the report) of each row of the table, in order.
TIER_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("remote ceiling", ("remote", "ceiling")),
    ("cold epoch (cache fill)", ("remote", "cold")),
    ("warm epoch (NVMe cache)", ("disk",)),
    ("RAM replay (ceiling)", ("ram",)),
    ("decode (1 process)", ("decode",)),
    ("loader end-to-end", ("loader",)),
    ("baseline", ("baseline",)),
)


#: verdict stage -> the report path of the row that measures it
STAGE_ROWS: dict[str, tuple[str, ...]] = {
    "network": ("remote", "cold"),
    "disk": ("disk",),
    "decode": ("decode",),
    "loader": ("loader",),
    "h2d": ("h2d",),
}


def bottleneck_stages(report: dict[str, Any]) -> list[str]:
    """The stages (keys of :data:`STAGE_ROWS`) the verdict names as the limit: one
    for a ``<stage>-bound`` verdict, ``disk`` for ``cache-too-small`` (the warm epoch
    refetches), the two closest stages for ``balanced``, none otherwise."""
    verdict = report.get("bottleneck", {})
    kind = str(verdict.get("kind", ""))
    if kind == "cache-too-small":
        return ["disk"]
    if kind == "balanced":
        stages = verdict.get("stages", {})
        return sorted(stages, key=lambda k: stages[k])[:2]
    stage = kind.removesuffix("-bound")
    return [stage] if kind.endswith("-bound") and stage in STAGE_ROWS else []


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _is_tier(value: Any) -> bool:
    return isinstance(value, dict) and "samples_per_s" in value and "mb_per_s" in value


def tier_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The measured tiers of ``report`` as ``(label, tier dict)`` in table order."""
    return [(label, tier) for label, tier, _ in _rows(report)]


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """``(label, tier, is the bottleneck)`` of each measured tier, in table order."""
    marked = {STAGE_ROWS[s] for s in bottleneck_stages(report)}
    rows = []
    for label, path in TIER_ROWS:
        tier = _get(report, path)
        if _is_tier(tier):
            rows.append((_label(label, report), tier, path in marked))
    return rows


def bottleneck_labels(report: dict[str, Any]) -> list[str]:
    """The table labels of the rows the verdict names as the bottleneck."""
    return [label for label, _, marked in _rows(report) if marked]


def pil_used(report: dict[str, Any], section: str) -> dict[str, Any] | None:
    """The PIL that decoded in ``section`` (``"decode"`` or ``"loader"``): the section's
    ``pil`` record (``library`` ``"Pillow"`` or ``"Pillow-SIMD"``, ``version``,
    ``resizer``), or for reports written before it, the machine's ``image_backend``
    (the same process's PIL). None where that section did not decode with PIL."""
    doc = report.get(section)
    if not isinstance(doc, dict):
        return None
    setting = doc.get("backend") if section == "decode" else doc.get("decode")
    if setting != "pil":
        return None
    pil = doc.get("pil") or _get(report, ("machine", "image_backend"))
    if not isinstance(pil, dict) or not pil.get("library"):
        return None
    return pil


def _decoder_name(report: dict[str, Any], section: str, setting: Any) -> str:
    pil = pil_used(report, section)
    return str(pil["library"]) if pil is not None else str(setting)


def _label(label: str, report: dict[str, Any]) -> str:
    if label == "remote ceiling":
        threads = _get(report, ("remote", "ceiling", "threads"))
        return f"remote ceiling ({threads} GETs)"
    if label.startswith("decode"):
        name = _decoder_name(report, "decode", report["decode"].get("backend"))
        return f"decode ({name}, 1 process)"
    if label.startswith("loader"):
        ld = report["loader"]
        name = _decoder_name(report, "loader", ld.get("decode"))
        return f"loader ({ld.get('workers')} workers, {name})"
    if label == "baseline":
        kind = report["baseline"].get("kind")
        return "baseline: GET per sample" if kind == "objects" else "baseline: shards, no cache"
    return label


def figures_problems(report: dict[str, Any]) -> list[str]:
    """What is wrong with ``report``: missing keys, a wrong version, tiers whose
    figures are not positive and finite. Empty when the report is well formed."""
    problems = [f"missing key {k!r}" for k in REQUIRED_KEYS if k not in report]
    if report.get("version") != SCHEMA_VERSION:
        problems.append(f"version is {report.get('version')!r}, expected {SCHEMA_VERSION}")
    for label, tier in tier_rows(report):
        for key in ("samples_per_s", "mb_per_s", "seconds", "bytes"):
            value = tier.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.append(f"{label}: {key} is {value!r}, expected a positive number")
    return problems


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _fmt_bytes(n: float) -> str:
    from fastload.config import format_size

    return format_size(n)


def _note(report: dict[str, Any], label: str, tier: dict[str, Any]) -> str:
    if label.startswith("remote ceiling"):
        return f"{tier.get('shard')}, {tier.get('passes')} pass(es)"
    if label.startswith("cold"):
        note = f"fetched {_fmt_bytes(tier.get('remote_bytes', 0))}"
        return note + (" (cache was warm!)" if tier.get("warm_at_start") else "")
    if label.startswith("warm"):
        spread = tier.get("spread")
        note = f"fetched {_fmt_bytes(tier.get('remote_bytes', 0))}"
        if isinstance(spread, float) and tier.get("epochs", 1) > 1:
            note += f", median of {tier.get('epochs')} (spread {spread:.0%})"
        return note
    if label.startswith("RAM"):
        return f"{tier.get('held_samples')} samples held, every byte read"
    if label.startswith("decode"):
        size = report["decode"].get("size")
        return f"size {size}" + (
            f", +{report['decode']['delay_s'] * 1e3:.0f} ms/sample"
            if report["decode"].get("delay_s")
            else ""
        )
    if label.startswith("loader"):
        wf = tier.get("wait_fraction")
        p50 = tier.get("wait_p50_s")
        note = f"batch {tier.get('batch_size')}"
        if isinstance(wf, float):
            note += f", loop waited {wf:.0%} of wall"
            if isinstance(p50, (int, float)):
                note += f" ({p50 * 1e3:,.1f} ms/batch median)"
            note += " [1]"
        return note
    if label.startswith("baseline"):
        return f"{tier.get('workers')} workers, {tier.get('requests')} GETs"
    return ""


def render_table(report: dict[str, Any]) -> str:
    """The report as a fixed-width table, the baseline ratios and the verdict."""
    ds = report.get("dataset", {})
    lines = [
        f"dataset: {ds.get('url')}  ({ds.get('samples')} samples in {ds.get('shards')} of "
        f"{ds.get('shards_total')} shards, {_fmt_bytes(ds.get('bytes', 0))})",
        "",
        f"{'tier':<34} {'samples/s':>11} {'MB/s':>9} {'bytes':>11}  note",
        "-" * 90,
    ]
    for label, tier, marked in _rows(report):
        flag = "<- bottleneck: " if marked else ""
        lines.append(
            f"{label:<34} {_fmt_rate(tier['samples_per_s']):>11} "
            f"{_fmt_rate(tier['mb_per_s']):>9} {_fmt_bytes(tier['bytes']):>11}  "
            f"{flag}{_note(report, label, tier)}"
        )
    h2d = report.get("h2d", {})
    if h2d.get("available"):
        flag = "<- bottleneck: " if "h2d" in bottleneck_stages(report) else ""
        lines.append(
            f"{'host-to-device':<34} {'':>11} {h2d['pinned_gb_s'] * 1e3:>9,.0f} {'':>11}  "
            f"{flag}pinned ({h2d['pageable_gb_s']:.1f} GB/s pageable)"
        )
    else:
        lines.append(
            f"{'host-to-device':<34} {'absent':>11} {'':>9} {'':>11}  {h2d.get('reason', '')}"
        )
    dec = report.get("decode", {})
    if not dec.get("measured", True):
        lines.append(f"{'decode':<34} {'absent':>11} {'':>9} {'':>11}  {dec.get('reason', '')}")
    lines += _pil_lines(report)
    if isinstance(report.get("loader", {}).get("wait_fraction"), float):
        lines += ["", *_WAIT_NOTE]
    ratios = report.get("baseline", {}).get("ratios")
    if ratios:
        parts = [
            f"{name} {ratios[key]:.1f}x"
            for name, key in (("cold", "cold_vs_baseline"), ("warm", "warm_vs_baseline"))
            if isinstance(ratios.get(key), (int, float))
        ]
        lines += ["", "fastload vs baseline: " + ", ".join(parts)]
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    verdict = report.get("bottleneck", {})
    lines += ["", f"bottleneck: {verdict.get('summary', '?')}"]
    for advice in verdict.get("advice", []):
        lines.append(f"  try: {advice}")
    for note in verdict.get("notes", []):
        lines.append(f"  also: {note}")
    return "\n".join(lines)


def _pil_lines(report: dict[str, Any]) -> list[str]:
    """One line per PIL that decoded a row (the same one for both rows, as a rule):
    its flavour, version, JPEG library and whose resize ran."""
    seen: dict[tuple[Any, ...], list[str]] = {}
    for section, row in (("decode", "decode"), ("loader", "loader")):
        pil = pil_used(report, section)
        if pil is not None:
            what = (pil.get("library"), pil.get("version"), pil.get("libjpeg_turbo"))
            resizer = pil.get("resizer")
            seen.setdefault((*what, resizer, pil.get("crop_decoder")), []).append(row)
    lines = []
    for (library, version, turbo, resizer, crops), rows in seen.items():
        line = f"PIL ({' and '.join(rows)} rows): {library} {version}"
        if turbo is not None:
            line += " with libjpeg-turbo" if turbo else " without libjpeg-turbo"
        if resizer:
            line += f", resized by {'torch' if resizer == 'torch' else resizer}"
        if crops:
            line += f"; crops decoded by {crops}"
        lines.append(line)
    return ["", *lines] if lines else []


_WAIT_NOTE = (
    "[1] wait: the share of the loader's wall time the consuming loop spent blocked on",
    "    the next batch. The bench's loop does no work, so near 100% is expected: the",
    "    loader sets the pace and its rate is the row's samples/s. In training the same",
    "    share is time the model sits idle; under ~5% the loader keeps up.",
)


def write_json(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``report`` as indented JSON to ``path`` (atomically: temp file, then rename)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)
