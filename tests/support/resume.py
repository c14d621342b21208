"""The exact-resume check the loader tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def resume_halves(make: Callable[[], Any], take: int) -> tuple[list[Any], list[Any], list[Any]]:
    """Iterate a fresh loader from ``make()`` whole (``full``); iterate another for
    ``take`` batches (``head``), save its ``state_dict()``, load that into a third and
    iterate it to the end (``rest``). A loader that resumes exactly has
    ``head + rest == full``; returns ``(full, head, rest)``."""
    full = list(make())
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(take)]
    state = first.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    return full, head, list(resumed)
