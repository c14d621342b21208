"""Exact data resume for Hugging Face training: ``transformers.Trainer`` and ``accelerate``.

``transformers.Trainer`` resumes a run mid-epoch by iterating the epoch again from
its start and throwing away the batches already trained (accelerate's
``skip_first_batches``): every skipped window is read and collated again, and the
stream is only the same when the order is a function of the epoch.
:class:`TrainerMixin` (or the ready-made :func:`trainer_class`) feeds the Trainer
from a :class:`fastload.DataLoader` instead, writes the loader's
:meth:`~fastload.DataLoader.state_dict` into every checkpoint folder
(:data:`STATE_FILE`, from its public ``save_model``, which the Trainer calls first
when it saves a checkpoint: the state is in the folder before the Trainer pushes it
to the Hub) and, on
``train(resume_from_checkpoint=...)``, loads it rather than skipping: the resumed run
reads only the batches it trains on, and they are exactly those of the uninterrupted
run. It overrides public ``Trainer`` methods only, none of its private ones.

``accelerate``: ``Accelerator.prepare`` passes an object that is not a
``torch.utils.data.DataLoader`` through unchanged (its stateful-dataloader option
wraps only torch's loaders), so a ``fastload.DataLoader`` is registered with
``accelerator.register_for_checkpointing(loader)``: ``save_state`` then stores its
state beside the model's and ``load_state`` restores it (the state is the same on
every rank, see :meth:`fastload.DataLoader.state_dict`).

``transformers`` is imported only when a Trainer is built or trains (torch is needed,
as for :class:`fastload.DataLoader`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from fastload.errors import ConfigError
from fastload.loader.dataloader import DataLoader

__all__ = ["STATE_FILE", "TrainerMixin", "load_loader_state", "save_loader_state", "trainer_class"]

#: The file in a checkpoint folder that holds the loader's state (JSON).
STATE_FILE = "fastload_loader_state.json"


def save_loader_state(loader: DataLoader, directory: str) -> str:
    """Write ``loader.state_dict()`` as JSON to ``directory/STATE_FILE`` (atomically);
    returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(loader.state_dict(), f)
    os.replace(tmp, path)
    return path


def load_loader_state(loader: DataLoader, directory: str) -> bool:
    """Load ``directory/STATE_FILE`` into ``loader``; False when the folder has none.
    Raises :class:`ConfigError` naming the file when it is not a loader state."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        return False
    try:
        with open(path) as f:
            state = json.load(f)
    except ValueError as exc:
        raise ConfigError(f"{path}: not a fastload loader state ({exc})") from exc
    if not isinstance(state, Mapping):
        raise ConfigError(f"{path}: not a fastload loader state (a JSON object expected)")
    loader.load_state_dict(state)
    return True


class TrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (before it) for exact resume.

    ``get_train_dataloader`` returns a :class:`fastload.DataLoader` over
    ``train_dataset`` with the Trainer's batch size (``args.train_batch_size``),
    ``dataloader_drop_last``, ``dataloader_num_workers`` and seed (``data_seed`` or
    ``seed``), fastload's own collate unless a ``data_collator`` other than the default
    was given, plus :attr:`fastload_loader_kwargs`. ``save_model``, which the Trainer
    calls first when it saves a checkpoint (``_internal_call`` with the checkpoint
    folder, a hyperparameter-search trial's folder included), writes the loader state
    into that folder too (:data:`STATE_FILE`, by the process that saves): it is there
    before the Trainer writes its own state, rotates the checkpoints (keeping the
    newest) and pushes the folder to the Hub;
    ``train(resume_from_checkpoint=...)`` remembers the folder and
    ``get_resumed_dataloader`` (the Trainer's hook for resuming mid-epoch) loads the
    state instead of skipping batches. A checkpoint without the file (made by a plain
    Trainer) resumes the Trainer's way, by skipping. The model's inputs are moved to its
    device by the Trainer as usual.

    Only public ``Trainer`` methods are overridden (``get_train_dataloader``,
    ``save_model``, ``train``, ``get_resumed_dataloader``;
    ``tests/text/test_hf_resume.py::test_the_mixin_overrides_no_private_trainer_method``).
    ``auto_find_batch_size`` is refused: a loader state counts batches of one size.
    """

    #: Extra keyword arguments of the :class:`fastload.DataLoader` the mixin builds.
    fastload_loader_kwargs: ClassVar[dict[str, Any]] = {}

    def get_train_dataloader(self) -> Any:
        from transformers.data.data_collator import default_data_collator

        t: Any = self
        if t.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        args = t.args
        if args.auto_find_batch_size:
            raise ConfigError(
                "TrainingArguments(auto_find_batch_size=True): not supported by "
                "fastload.hf.TrainerMixin (its loader state counts batches of one size)"
            )
        collate = t.data_collator
        loader = DataLoader(
            t.train_dataset,
            batch_size=args.train_batch_size,
            drop_last=args.dataloader_drop_last,
            num_workers=args.dataloader_num_workers,
            collate_fn=None if collate is default_data_collator else collate,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            **self.fastload_loader_kwargs,
        )
        self.fastload_loader = loader
        return loader

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's ``save_model``; for a checkpoint (``_internal_call`` with a
        folder), the state of the loader being trained is written into it as well."""
        t: Any = self
        super().save_model(output_dir, _internal_call=_internal_call)  # type: ignore[misc]
        loader = getattr(self, "fastload_loader", None)
        if output_dir is None or not (_internal_call and t.args.should_save):
            return
        if isinstance(loader, DataLoader):
            save_loader_state(loader, output_dir)

    def train(self, resume_from_checkpoint: str | bool | None = None, *a: Any, **kw: Any) -> Any:
        t: Any = self
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(t.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No valid checkpoint found in output directory ({t.args.output_dir})"
                )
        self.fastload_resume_dir = resume_from_checkpoint or None
        return super().train(resume_from_checkpoint, *a, **kw)  # type: ignore[misc]

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        where = getattr(self, "fastload_resume_dir", None)
        if isinstance(dataloader, DataLoader) and where and load_loader_state(dataloader, where):
            state = dataloader.state_dict()
            if state.get("batches_consumed", num_batches) != num_batches:
                raise ConfigError(
                    f"{os.path.join(where, STATE_FILE)}: the loader state is "
                    f"{state.get('batches_consumed')} batches into its epoch, the Trainer's "
                    f"checkpoint {num_batches}"
                )
            return dataloader
        return super().get_resumed_dataloader(dataloader, num_batches)  # type: ignore[misc]


def trainer_class(base: Any = None) -> Any:
    """``base`` (default ``transformers.Trainer``) with :class:`TrainerMixin` mixed in."""
    if base is None:
        from transformers import Trainer as base
    return type(f"Fastload{base.__name__}", (TrainerMixin, base), {})
