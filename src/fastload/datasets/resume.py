"""torchdata's ``Stateful`` convention for fastload's iterable datasets.

:class:`StreamingDataset` and :class:`TokenDataset` keep the same iteration state: the
plan (``SamplerState``: seed, epoch, layout, global samples consumed), the loader's
batch size and ``drop_last``, and how far this process's iterator got into its
DataLoader worker's share. :class:`IterableResume` turns that into the dict
``state_dict()`` returns and back; each dataset supplies its own ``loader_state()`` /
``load_loader_state()`` (what the plan needs, with its own consistency checks) and
``_resume_started()`` (its plan as started by the current world).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from fastload.errors import ConfigError
from fastload.sampling import SamplerState

__all__ = ["IterableResume"]

_VERSION = 1


class IterableResume:
    """``state_dict`` / ``load_state_dict`` and the worker-position check for an
    iterable dataset (a mixin: the dataset provides the attributes declared here)."""

    #: ``state["kind"]`` of this dataset's states, and its name in messages
    _state_kind: ClassVar[str]
    _state_label: ClassVar[str]

    _state: SamplerState
    _position: tuple[int, int]
    _saved_position: tuple[int, int] | None
    _yielded: int
    _skip: int
    batch_size: int
    drop_last: bool

    if TYPE_CHECKING:  # what each dataset defines

        def loader_state(self) -> dict[str, Any]: ...

        def load_loader_state(self, state: dict[str, Any]) -> None: ...

        def _resume_started(self) -> SamplerState: ...

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset stands, as a JSON-serialisable dict (the
        ``torchdata`` ``Stateful`` convention): the plan (seed, epoch, layout, batch
        size, the global samples consumed before this iteration) and the samples this
        process's iterator has yielded of its worker's share. In a DataLoader worker
        that is the worker's own position, which ``StatefulDataLoader`` keeps per
        worker, in step with the batches the caller consumed."""
        worker, workers = self._position
        return {
            "kind": self._state_kind,
            "version": _VERSION,
            **self.loader_state(),
            "samples_consumed": self._resume_started().samples_consumed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "worker": worker,
            "num_workers": workers,
            "yielded": self._yielded,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iterator continues the saved
        worker's share after the samples it had yielded. Raises :class:`ConfigError`
        for a state of another kind or dataset layout, or (when iterating) a different
        worker split."""
        if state.get("kind") != self._state_kind or state.get("version") != _VERSION:
            raise ConfigError(
                f"not a {self._state_label} state (kind {state.get('kind')!r}, version "
                f"{state.get('version')!r})"
            )
        self.load_loader_state(dict(state))  # seed, epoch, layout, with their checks
        self.batch_size = int(state["batch_size"])
        self.drop_last = bool(state["drop_last"])
        self._state = dataclasses.replace(
            self._state, samples_consumed=int(state["samples_consumed"])
        )
        self._saved_position = (int(state["worker"]), int(state["num_workers"]))
        self._yielded = self._skip = int(state["yielded"])

    def _start_position(self, position: tuple[int, int]) -> int:
        """Begin an iteration as worker ``position`` (``(worker, num_workers)``):
        returns the samples of its share to skip (a loaded state's), refusing a state
        saved by another worker split."""
        skip, self._skip = self._skip, 0
        saved: tuple[int, int] | None = getattr(self, "_saved_position", None)
        if skip and saved is not None and saved != position:
            raise ConfigError(
                f"this {self._state_label} state was saved by DataLoader worker {saved[0]} "
                f"of {saved[1]}; it is loaded into worker {position[0]} of {position[1]}: "
                "resume with the same number of workers"
            )
        self._position = position
        self._yielded = skip
        return skip
