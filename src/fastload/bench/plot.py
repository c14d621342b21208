"""Draw a benchmark report as a PNG: one horizontal bar per tier, samples/s and MB/s.

matplotlib is imported here only (Agg backend, no display needed).
"""

from __future__ import annotations

import os
from typing import Any

from fastload.bench.report import bottleneck_labels, tier_rows
from fastload.errors import MissingDependencyError

__all__ = ["plot_report"]


def plot_report(report: dict[str, Any], path: str | os.PathLike[str]) -> list[str]:
    """Write a bar chart of ``report``'s tiers (and the baseline) to ``path`` (PNG).

    Two panels side by side, samples/s and MB/s, the bottleneck verdict as the
    title; the bars of the tier the verdict names are drawn in red and labelled
    "bottleneck". Returns the labels of those bars. Raises
    :class:`MissingDependencyError` without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "bench", "drawing --plot") from exc

    rows = list(reversed(tier_rows(report)))  # first tier at the top
    labels = [label for label, _ in rows]
    sps = [float(t["samples_per_s"]) for _, t in rows]
    mbs = [float(t["mb_per_s"]) for _, t in rows]
    marked = bottleneck_labels(report)
    h2d = report.get("h2d", {})
    h2d_sps = report.get("bottleneck", {}).get("stages", {}).get("h2d")
    if h2d.get("available") and isinstance(h2d_sps, (int, float)):
        labels.insert(0, "host-to-device (pinned)")  # at the bottom, as in the table
        sps.insert(0, float(h2d_sps))
        mbs.insert(0, float(h2d["pinned_gb_s"]) * 1e3)
        if report.get("bottleneck", {}).get("kind") == "h2d-bound":
            marked.append("host-to-device (pinned)")
    colors = [
        "#d62728" if label in marked else "#9e9e9e" if label.startswith("baseline") else "#1f77b4"
        for label in labels
    ]

    fig, axes = plt.subplots(1, 2, figsize=(13, 0.55 * len(rows) + 2.2), sharey=True)
    try:
        for ax, values, unit in ((axes[0], sps, "samples/s"), (axes[1], mbs, "MB/s")):
            bars = ax.barh(labels, values, color=colors)
            ax.set_xscale("log")
            ax.set_xlabel(f"{unit} (log scale)")
            ax.grid(axis="x", which="both", alpha=0.3)
            for bar, v, label in zip(bars, values, labels, strict=True):
                ax.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {v:,.0f}" + ("  \u25c0 bottleneck" if label in marked else ""),
                    va="center",
                    fontsize=9,
                    color="#d62728" if label in marked else "black",
                    fontweight="bold" if label in marked else "normal",
                )
            if values:
                ax.set_xlim(
                    min(v for v in values if v > 0) / 2 if any(values) else 1,
                    max(values) * 4 if any(values) else 10,
                )
        axes[0].tick_params(axis="y", labelsize=10)
        verdict = str(report.get("bottleneck", {}).get("summary", ""))
        ds = report.get("dataset", {})
        fig.suptitle(
            f"fastload bench: {ds.get('samples')} samples, {ds.get('url')}\n{_wrap(verdict)}",
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=110)
    finally:
        plt.close(fig)
    return marked


def _wrap(text: str, width: int = 130) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or " "
