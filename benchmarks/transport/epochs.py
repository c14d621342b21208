"""Timing, checking and comparing the variants of a section.

:class:`Tally` notes what an epoch delivered (its keys, the first and last batch's
times, the image shape); :func:`check_epochs` fails a variant that dropped or
repeated a sample; :func:`run_variants` runs a section's variants in interleaved
rounds and gives their summaries and ratios; :func:`goal_lines` the met/missed lines.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch

from _epoch_common import Epoch, batch_images, interleaved, ratios, summarize


class Section(Protocol):
    """What :func:`run_variants` reads of a section's context (``transport.data.Ctx``)."""

    args: argparse.Namespace
    mean_bytes: float
    bs: int
    nw: int
    n: int


def batch_keys(batch: Any) -> list[str] | None:
    """The sample keys of a batch (None for batches without ``__key__``)."""
    if isinstance(batch, Mapping) and "__key__" in batch:
        return [str(k) for k in batch["__key__"]]
    return None


class Tally:
    """Iterates ``loader`` and notes every batch's keys, the time of the first and
    the last batch, and the first image batch's shape (the checks and the steady
    rate are computed from these after the timed epoch)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.keys: list[str] = []
        self.first: float | None = None
        self.last = 0.0
        self.first_samples = 0
        self.samples = 0
        self.shape: list[int] | None = None

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            now = time.perf_counter()
            if self.first is None:
                self.first, self.first_samples = now, batch_images(batch)
                self.shape = image_shape(batch)
            self.samples += batch_images(batch)
            keys = batch_keys(batch)
            if keys is not None:
                self.keys.extend(keys)
            self.last = now
            yield batch


def image_shape(batch: Any) -> list[int] | None:
    """Shape of a batch's image tensor, if it holds one."""
    value: Any = batch
    if isinstance(batch, Mapping):
        value = batch.get("jpg")
    elif isinstance(batch, (list, tuple)) and batch:
        value = batch[0]
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def tally_facts(t: Tally, expected: set[str] | None) -> dict[str, Any]:
    """What :func:`check_epochs` checks, and the steady rate of one epoch."""
    out: dict[str, Any] = {"shape": t.shape}
    if t.first is not None and t.last > t.first:
        out["steady_per_s"] = (t.samples - t.first_samples) / (t.last - t.first)
    if expected is not None and t.keys:
        seen = set(t.keys)
        out["keys_delivered"] = len(t.keys)
        out["keys_missing"] = len(expected - seen)
        out["keys_unknown"] = len(seen - expected)
        out["keys_repeated"] = len(t.keys) - len(seen)
    return out


def check_epochs(name: str, epochs: list[Epoch], n: int, pad: int, keyed: bool) -> None:
    """Every epoch of ``name`` delivered each of the ``n`` samples once (``pad``:
    repeats allowed to fill the last batches). Raises AssertionError otherwise."""
    for k, e in enumerate(epochs):
        x = e.extra
        if not n <= e.samples < n + max(pad, 1):
            raise AssertionError(f"{name} epoch {k}: {e.samples} samples, the data has {n}")
        if keyed:
            if "keys_missing" not in x:
                raise AssertionError(f"{name} epoch {k}: its batches carry no __key__")
            if x["keys_missing"] or x["keys_unknown"] or x["keys_repeated"] >= max(pad, 1):
                raise AssertionError(f"{name} epoch {k}: bad keys {x}")


def close_loader(loader: Any) -> dict[str, Any]:
    """A fastload loader's I/O counters, then close it and its dataset."""
    facts = {k: int(v) for k, v in loader.io_stats().items()}
    facts["transport"] = loader.transport
    loader.close()
    loader.dataset.close()
    return facts


def run_variants(
    ctx: Section,
    variants: dict[str, Callable[[], Epoch]],
    pairs: list[tuple[str, str]],
    unkeyed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run ``variants`` interleaved; check every epoch; summaries and the ratios of
    ``pairs`` (candidate, baseline)."""
    epochs = interleaved(variants, ctx.args.repeats)
    results = {name: summarize(e, ctx.mean_bytes) for name, e in epochs.items()}
    for name, r in results.items():
        pad = ctx.bs * ctx.nw if "stream" in name else 0
        check_epochs(name, epochs[name], ctx.n, pad, name not in unkeyed)
        steady = [e.extra["steady_per_s"] for e in epochs[name] if "steady_per_s" in e.extra]
        r["steady_per_s"] = statistics.median(steady) if steady else None
        passes = [
            e.extra["reporting_passes"] for e in epochs[name] if "reporting_passes" in e.extra
        ]
        if passes:  # timed epochs that the VM's free page reporting ran inside
            r["epochs_with_reporting"] = sum(map(bool, passes))
        aside = [x for e in epochs[name] for x in e.extra.get("set_aside_per_s", [])]
        if any("reporting_passes" in e.extra for e in epochs[name]):
            r["set_aside_per_s"] = [round(x, 1) for x in aside]
        for key in ("remote_bytes", "cache_misses", "transport"):
            vals = [e.extra[key] for e in epochs[name] if key in e.extra]
            if vals:
                r[key] = sorted(set(vals))
        r["shape"] = next((e.extra["shape"] for e in epochs[name] if e.extra.get("shape")), None)
    rows: dict[str, Any] = {}
    for cand, base in pairs:
        rows.update(ratios(results, epochs, {cand: base}))
        a, b = results[cand]["steady_per_s"], results[base]["steady_per_s"]
        rows[f"{cand}/{base}"]["steady"] = a / b if a and b else None
    return {"results": results, "ratios": rows}


def goal_lines(rows: Mapping[str, Any], goals: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """One goal line per ``(ratio name, at least)``; met when the paired ratio (the
    median over rounds of the ratio within a round) reaches it."""
    return [
        {
            "ratio": name,
            "need": need,
            "paired": rows[name]["paired"],
            "wall": rows[name]["wall"],
            "met": rows[name]["paired"] >= need,
        }
        for name, need in goals
    ]
