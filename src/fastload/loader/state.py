"""The :class:`~fastload.DataLoader`'s state: its resume point, the dict that saves
it, and the contract an iterable dataset implements to resume.

The state is ``(epoch, batches consumed)``, counted as batches handed to the caller
(never those prefetched by workers), plus the configuration the order depends on
(:class:`StateKey`), so it is the same dict on every rank of a synchronised job. A
state loads into a loader with the same global batch size (the world size may
differ), the same seed, shuffle, drop_last and dataset length; :func:`read_state`
names whatever differs. The format is versioned (:data:`STATE_VERSION`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fastload.errors import ConfigError

__all__ = [
    "STATE_VERSION",
    "ResumableIterable",
    "StateKey",
    "count_batches",
    "make_state",
    "position_dataset",
    "read_state",
    "restore_dataset",
    "rolled_over",
]

STATE_VERSION = 1


@runtime_checkable
class ResumableIterable(Protocol):
    """What an ``IterableDataset`` implements to be resumable by :class:`DataLoader`.

    The loader calls, in the process that iterates (each worker, or the main
    process when ``num_workers == 0``), before every ``iter(dataset)``:
    ``set_epoch(epoch)`` then ``configure(batch_size=, drop_last=,
    samples_consumed=)``. ``samples_consumed`` is *global*: batches the caller
    consumed times the global batch size (per-rank batch size x ranks). The dataset
    then yields this rank's sequence for the epoch from that point on, split over
    DataLoader workers by batch, round-robin: worker ``w`` of ``W`` yields the
    samples of the rank's batches ``j`` with ``j % W == w`` (whole batches of
    ``batch_size``), so torch's round-robin over workers reproduces the rank's
    sequence exactly. Every rank must yield the same number of batches.

    ``len(dataset)``, when defined, is the number of samples this rank yields per
    epoch (all workers together); the loader then knows its ``len``.

    ``loader_state()`` returns a small JSON-serialisable dict (seed, the canonical
    layout, ...) that the loader stores under ``"dataset"`` in its state; the loader
    asks its own copy after setting it to what the caller consumed.
    ``load_loader_state(state)`` restores it and raises
    :class:`~fastload.errors.ConfigError` if the state does not fit the dataset; the
    loader also calls it in the iterating process before every ``iter()`` (after
    ``set_epoch``, before ``configure``) with its own copy's state, so a state loaded
    into a running loader reaches persistent workers whole.
    """

    def set_epoch(self, epoch: int) -> None: ...

    def configure(self, *, batch_size: int, drop_last: bool, samples_consumed: int) -> None: ...

    def loader_state(self) -> dict[str, Any]: ...

    def load_loader_state(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class StateKey:
    """What a loader's order depends on besides the epoch: saved in its state and
    compared with the loading loader's. ``dataset_length`` is None for an iterable
    dataset (it orders itself)."""

    batch_size: int
    world_size: int
    seed: int
    shuffle: bool
    drop_last: bool
    dataset_length: int | None

    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks: ``batch_size x world_size``."""
        return self.batch_size * self.world_size


def count_batches(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``batch_size`` in ``samples`` (the short last one dropped or kept)."""
    if drop_last:
        return samples // batch_size
    return -(-samples // batch_size)


def rolled_over(epoch: int, consumed: int, batches_per_epoch: int | None) -> tuple[int, int]:
    """``(epoch, consumed)``, or the start of the next epoch when ``consumed`` reached
    the end of this one (an unknown or empty epoch never rolls over)."""
    if batches_per_epoch and consumed >= batches_per_epoch:
        return epoch + 1, 0
    return epoch, consumed


def position_dataset(
    dataset: Any, epoch: int, *, batch_size: int, drop_last: bool, samples_consumed: int
) -> None:
    """Set a :class:`ResumableIterable` (this process's copy) to ``epoch`` from
    ``samples_consumed`` global samples on; anything else is left alone."""
    if isinstance(dataset, ResumableIterable):
        dataset.set_epoch(epoch)
        dataset.configure(
            batch_size=batch_size, drop_last=drop_last, samples_consumed=samples_consumed
        )


def make_state(
    key: StateKey, epoch: int, consumed: int, dataset_state: Mapping[str, Any]
) -> dict[str, Any]:
    """The state dict (JSON-serialisable; the format :func:`read_state` reads)."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches_consumed": consumed,
        "global_batch_size": key.global_batch_size,
        "batch_size": key.batch_size,
        "world_size": key.world_size,
        "seed": key.seed,
        "shuffle": key.shuffle,
        "drop_last": key.drop_last,
        "dataset_length": key.dataset_length,
        "dataset": dict(dataset_state),
    }


def read_state(
    state: Any, key: StateKey, batches_per_epoch: int | None
) -> tuple[int, int, dict[str, Any]]:
    """``(epoch, batches consumed, the dataset's state)`` of a saved ``state``, checked
    against the loading loader's ``key``.

    Raises :class:`ConfigError` naming what differs (version, global batch size,
    dataset length, seed, shuffle, drop_last) or what is missing or out of range.
    """
    if not isinstance(state, Mapping):
        raise ConfigError(f"loader state must be a dict, got {type(state).__name__}")
    try:
        version = state["version"]
        epoch = int(state["epoch"])
        consumed = int(state["batches_consumed"])
        saved_global = int(state["global_batch_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"loader state is missing or has a bad field: {e!r}") from e
    if version != STATE_VERSION:
        raise ConfigError(
            f"loader state version {version!r} is not supported (expected {STATE_VERSION})"
        )
    if saved_global != key.global_batch_size:
        raise ConfigError(
            f"loader state was saved with global batch size {saved_global} "
            f"({state.get('batch_size')} per rank x {state.get('world_size')} ranks); this "
            f"loader's is {key.global_batch_size} ({key.batch_size} x "
            f"{key.world_size}): the batch boundaries would not match"
        )
    mine: dict[str, Any] = {
        "seed": key.seed,
        "shuffle": key.shuffle,
        "drop_last": key.drop_last,
        "dataset_length": key.dataset_length,
    }
    for name, value in mine.items():
        if name in state and state[name] != value:
            what = "dataset length" if name == "dataset_length" else name
            raise ConfigError(
                f"loader state was saved with {what} {state[name]!r}; this loader has "
                f"{value!r}: the order would differ"
            )
    if epoch < 0 or consumed < 0:
        raise ConfigError(f"loader state has a negative epoch or count: {dict(state)!r}")
    n = batches_per_epoch
    if n is not None and consumed > n:
        raise ConfigError(
            f"loader state has {consumed} batches consumed; an epoch here has only {n}"
        )
    return epoch, consumed, dict(state.get("dataset") or {})


def restore_dataset(
    dataset: Any, dataset_state: dict[str, Any], *, iterable: bool, consumed: int
) -> None:
    """Give ``dataset`` its part of a loaded state (``load_loader_state``). Raises
    :class:`ConfigError` for an iterable dataset that cannot resume mid-epoch."""
    if callable(getattr(dataset, "load_loader_state", None)):
        dataset.load_loader_state(dataset_state)
    elif iterable and consumed > 0:
        raise ConfigError(
            f"{type(dataset).__name__} does not implement "
            "fastload.loader.ResumableIterable; it cannot resume mid-epoch"
        )
