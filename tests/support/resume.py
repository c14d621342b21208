"""The exact-resume check the loader tests share, and the elastic resume in a later
epoch that the map-style and the token loader tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload.sampling import World


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


def elastic_resume_in_epoch_1(
    loaders: Callable[[list[World]], list[Any]], ids: Callable[[list[Any]], list[Any]]
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """Loaders for 2 nodes x 1 rank (``loaders(worlds)``) each iterate epoch 0 whole and
    3 batches of epoch 1 (``before``: the ``ids`` of those batches); rank 0's
    ``state_dict()`` is loaded into fresh loaders (still at epoch 0) for 1 node x 2
    ranks, which iterate to the end (``after``). Returns ``(before, after, state)``."""
    two_nodes = loaders(World.every_rank(2, 1))
    before: list[Any] = []
    for lo in two_nodes:
        list(lo)  # epoch 0
        it = iter(lo)
        before += ids([next(it) for _ in range(3)])
        del it
    state = two_nodes[0].state_dict()
    after: list[Any] = []
    for lo in loaders(World.every_rank(1, 2)):
        lo.load_state_dict(state)
        after += ids(list(lo))
    return before, after, state
