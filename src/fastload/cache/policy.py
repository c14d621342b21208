"""Pure eviction policy: which entries to drop so a new one fits under the byte cap.

No I/O here: the disk and RAM tiers hand in a snapshot of their entries and act on
the answer, so the choice is tested on its own (property tests in
``tests/cache/test_policy.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Candidate", "choose_victims"]


@dataclass(frozen=True)
class Candidate:
    """One entry as the policy sees it: a name, its size, when it was last used, and
    whether a reader holds it (pinned entries are never chosen)."""

    name: str
    size: int
    last_use: float
    pinned: bool = False


def choose_victims(
    entries: Iterable[Candidate], need: int, limit: int | None
) -> tuple[list[str], int]:
    """Choose least-recently-used unpinned entries to evict so ``need`` more bytes fit.

    ``entries`` are everything that occupies the tier now (their sizes sum to the bytes
    used). Returns ``(victims, shortfall)``: the names to evict, oldest first, and how
    many bytes would still be over ``limit`` after evicting them (0 when the new entry
    fits; positive only when pinned entries hold the rest). Ties in ``last_use`` break
    by name so the choice is deterministic. With ``limit=None`` nothing is evicted.
    """
    items = list(entries)
    if limit is None:
        return [], 0
    used = sum(e.size for e in items)
    over = used + need - limit
    if over <= 0:
        return [], 0
    victims: list[str] = []
    for e in sorted((e for e in items if not e.pinned), key=lambda e: (e.last_use, e.name)):
        if over <= 0:
            break
        victims.append(e.name)
        over -= e.size
    return victims, max(over, 0)
