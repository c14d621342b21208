"""``fastload bench`` and ``fastload demo``: measure every tier, name the bottleneck.

:func:`run_bench` measures one dataset (remote ceiling, cold and warm cache epochs,
RAM replay, decode, end-to-end loader, host-to-device, baseline) and returns a
versioned report (:mod:`fastload.bench.report`); :func:`bottleneck` is the pure
verdict over the figures; :class:`LocalS3` runs a throwaway SeaweedFS S3 server.
Names resolve lazily: importing this package imports neither torch nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    "BenchSettings": "fastload.bench.runner",
    "Figures": "fastload.bench.verdict",
    "LocalS3": "fastload.bench.local_s3",
    "SCHEMA_VERSION": "fastload.bench.report",
    "TierResult": "fastload.bench.tiers",
    "Verdict": "fastload.bench.verdict",
    "bottleneck": "fastload.bench.verdict",
    "machine_info": "fastload.bench.machine",
    "plot_report": "fastload.bench.plot",
    "render_table": "fastload.bench.report",
    "run_bench": "fastload.bench.runner",
}

__all__ = [
    "SCHEMA_VERSION",
    "BenchSettings",
    "Figures",
    "LocalS3",
    "TierResult",
    "Verdict",
    "bottleneck",
    "machine_info",
    "plot_report",
    "render_table",
    "run_bench",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastload.bench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from fastload.bench.local_s3 import LocalS3
    from fastload.bench.machine import machine_info
    from fastload.bench.plot import plot_report
    from fastload.bench.report import SCHEMA_VERSION, render_table
    from fastload.bench.runner import BenchSettings, run_bench
    from fastload.bench.tiers import TierResult
    from fastload.bench.verdict import Figures, Verdict, bottleneck
