"""What a conversion into shards reports: the written dataset's manifest, the inputs
left out under ``on_error="skip"`` (:class:`ErrorPolicy`), and the progress bar.

Shared by every converter (:mod:`fastload.convert` for images, :mod:`fastload.text`
for token shards); :mod:`fastload.convert` re-exports :class:`ConvertReport` and
:class:`SkippedItem`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import ConfigError, FastloadError, SourceDataError
from fastload.shards.manifest import Manifest
from fastload.shards.writer import ShardWriter

__all__ = ["ConvertReport", "ErrorPolicy", "SkippedItem", "finish", "progress_bar"]


@dataclass(frozen=True)
class SkippedItem:
    """One input left out under ``on_error="skip"``: what it was, its file, and why."""

    item: str
    path: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``fastload convert --json``."""
        return {"item": self.item, "path": self.path, "reason": self.reason}


@dataclass
class ConvertReport:
    """What a conversion produced: the written dataset's manifest and what was skipped."""

    manifest: Manifest
    skipped: list[SkippedItem] = field(default_factory=list)

    @property
    def samples(self) -> int:
        """Samples written."""
        return self.manifest.num_samples

    def headline(self) -> str:
        """The first line of :meth:`summary`: what was written, where."""
        m = self.manifest
        return (
            f"wrote {m.num_samples} samples in {len(m.shards)} shard(s), "
            f"{m.total_bytes} bytes, to {m.url}"
        )

    def summary(self) -> str:
        """A few human-readable lines: counts, size, and each skipped item."""
        lines = [self.headline()]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} bad input(s):")
            lines.extend(f"  {s.item}: {s.path}: {s.reason}" for s in self.skipped)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``fastload convert --json``."""
        m = self.manifest
        return {
            "url": m.url,
            "kind": m.source.get("kind"),
            "samples": m.num_samples,
            "shards": len(m.shards),
            "bytes": m.total_bytes,
            "fields": list(m.fields),
            "skipped": [s.to_dict() for s in self.skipped],
        }


class ErrorPolicy:
    """What to do with a bad input: ``"raise"`` a :class:`SourceDataError` naming it,
    or ``"skip"`` it and remember it for the report."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skipped: list[SkippedItem] = []

    def bad(self, item: str, error: SourceDataError) -> None:
        """Report a bad input; raises ``error`` unless skipping."""
        if self.on_error == "raise":
            raise error
        self.skipped.append(SkippedItem(item=item, path=error.path, reason=error.reason))


def finish(writer: ShardWriter, policy: ErrorPolicy, progress: bool) -> ConvertReport:
    """The report of a closed writer; with ``progress``, skipped inputs are listed on stderr."""
    if writer.manifest is None:
        raise FastloadError(f"{writer.url}: the writer did not finish; this is a bug in fastload")
    report = ConvertReport(writer.manifest, policy.skipped)
    if progress and report.skipped:
        print(report.summary(), file=sys.stderr)
    return report


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm bar on stderr (a no-op object when ``enabled`` is false)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="sample",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
    )
