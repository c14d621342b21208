"""Exact data resume for Hugging Face training (``fastload.hf``): a ``transformers.Trainer``
stopped at a checkpoint and resumed, and an ``accelerate`` loop saved and loaded with
``save_state``/``load_state``, continue with exactly the batches of the uninterrupted
run, and read only those (``loader.stats()`` counts the batches the loader served)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_helpers import chat_tokenizer, hf_tokenizer, make_chats, write_chat_jsonl

import fastload
from fastload import World
from fastload.text.chat import ChatConfig
from support.tiny_llama import tiny_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
accelerate = pytest.importorskip("accelerate")

from fastload.hf import STATE_FILE, trainer_class  # noqa: E402

pytestmark = pytest.mark.slow

L = 64


def lora_llama(vocab: int) -> Any:
    return tiny_lora(vocab, seq_len=L, attn="eager")


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    tmp = tmp_path_factory.mktemp("hfresume")
    tok = chat_tokenizer(str(tmp / "tok"))
    src = write_chat_jsonl(str(tmp / "chat.jsonl"), make_chats(40, seed=3, max_turns=1))
    fastload.convert.text(src, str(tmp / "out"), tokenizer=tok, chat=ChatConfig(seq_len=L))
    return str(tmp / "out"), len(hf_tokenizer(tok))


def _dataset(url: str) -> Any:
    return fastload.TokenDataset(
        url, seq_len=L, labels="hf", shuffle=True, seed=5, world=World.single()
    )


def test_trainer_resume_loads_the_loader_state_and_reads_no_skipped_batch(
    chat_data: tuple[str, int], tmp_path: Path
) -> None:
    url, vocab = chat_data
    Trainer = trainer_class()
    n = len(_dataset(url))
    per_epoch = n // 4
    assert per_epoch >= 4
    save_at = per_epoch + per_epoch // 2  # mid-way through the second epoch
    steps = 2 * per_epoch + 2

    def run(out: str, max_steps: int, resume: str | None = None) -> tuple[list[Any], Any]:
        model = lora_llama(vocab)
        seen: list[list[int]] = []
        model.get_base_model().register_forward_pre_hook(
            lambda _m, _a, kw: seen.extend(kw["labels"].tolist()), with_kwargs=True
        )
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=max_steps,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            save_strategy="steps",
            save_steps=save_at,
            dataloader_drop_last=True,
            seed=0,
            disable_tqdm=True,
            logging_steps=100,
        )
        trainer = Trainer(model=model, args=args, train_dataset=_dataset(url))
        trainer.train(resume_from_checkpoint=resume)
        return seen, trainer.fastload_loader

    full, _ = run(str(tmp_path / "full"), steps)
    assert len(full) == steps * 4
    run(str(tmp_path / "part"), save_at)
    ckpt = tmp_path / "part" / f"checkpoint-{save_at}"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert (state["epoch"], state["batches_consumed"]) == (1, save_at - per_epoch)
    rest, loader = run(str(tmp_path / "part"), steps, resume=str(ckpt))
    assert rest == full[save_at * 4 :]
    # the loader served only the batches trained after the checkpoint: the Trainer
    # skipped none (its skip would have served the epoch's first ones again)
    assert loader.stats().batches == steps - save_at
    assert full[: per_epoch * 4] != full[per_epoch * 4 : 2 * per_epoch * 4]  # shuffled epochs


def test_trainer_resume_true_finds_the_last_checkpoint(
    chat_data: tuple[str, int], tmp_path: Path
) -> None:
    """``resume_from_checkpoint=True`` resolves to the last checkpoint, whose state loads."""
    url, vocab = chat_data
    Trainer = trainer_class()

    def trainer(max_steps: int) -> Any:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=max_steps,
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
            save_strategy="steps",
            save_steps=3,
            dataloader_drop_last=True,
            disable_tqdm=True,
        )
        return Trainer(model=lora_llama(vocab), args=args, train_dataset=_dataset(url))

    trainer(3).train()
    t = trainer(5)
    t.train(resume_from_checkpoint=True)
    assert t.fastload_resume_dir == str(tmp_path / "run" / "checkpoint-3")
    assert t.fastload_loader.stats().batches == 2


def _accelerate_run(url: str, vocab: int, out: Path, stop: int | None, resume: bool) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    model = lora_llama(vocab)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loader = fastload.DataLoader(_dataset(url), batch_size=4, drop_last=True, seed=0)
    model, opt, prepared = acc.prepare(model, opt, loader)
    assert prepared is loader  # not a torch DataLoader: accelerate passes it through
    acc.register_for_checkpointing(loader)
    if resume:
        acc.load_state(str(out))
    seen: list[list[int]] = []
    steps = 0
    start = loader.state_dict()["epoch"]  # the resumed epoch (0 on a fresh run)
    for epoch in range(start, 2):
        loader.set_epoch(epoch)
        for batch in loader:
            seen.extend(batch["labels"].tolist())
            loss = model(**batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            steps += 1
            if stop is not None and steps == stop:
                acc.save_state(str(out))
                return seen, loader
    return seen, loader


def test_accelerate_save_state_load_state_resumes_exactly(
    chat_data: tuple[str, int], tmp_path: Path
) -> None:
    url, vocab = chat_data
    per_epoch = len(_dataset(url)) // 4
    stop = per_epoch + 2
    full, _ = _accelerate_run(url, vocab, tmp_path / "x", None, False)
    assert len(full) == 2 * per_epoch * 4
    first, _ = _accelerate_run(url, vocab, tmp_path / "ckpt", stop, False)
    assert first == full[: stop * 4]
    assert any(f.startswith("custom_checkpoint_") for f in os.listdir(tmp_path / "ckpt"))
    rest, loader = _accelerate_run(url, vocab, tmp_path / "ckpt", None, True)
    assert rest == full[stop * 4 :]
    assert loader.stats().batches == 2 * per_epoch - stop


def test_the_mixin_overrides_no_private_trainer_method() -> None:
    """``TrainerMixin`` (and what ``trainer_class`` makes) overrides only public
    ``transformers.Trainer`` methods, each one the Trainer still has: a private one
    may change under users between ``transformers`` releases."""
    from fastload.hf import TrainerMixin

    Trainer = transformers.Trainer
    for cls in (TrainerMixin, trainer_class()):
        own = [n for n in vars(cls) if callable(getattr(cls, n)) and n != "__init_subclass__"]
        private = [
            n for n in own if n.startswith("_") and not n.endswith("__") and hasattr(Trainer, n)
        ]
        assert private == [], f"{cls.__name__} overrides private Trainer methods {private}"
        assert [n for n in own if not n.startswith("_") and not hasattr(Trainer, n)] == []
    assert {n for n in vars(TrainerMixin) if callable(getattr(TrainerMixin, n))} >= {
        "get_train_dataloader", "train", "get_resumed_dataloader"}  # fmt: skip


def test_rotated_checkpoints_keep_their_loader_state(
    chat_data: tuple[str, int], tmp_path: Path
) -> None:
    """The state is written into each checkpoint folder as the Trainer saves it, and
    rotation keeps it with its folder: with ``save_total_limit=2`` the two kept folders
    each hold the state of their own step."""
    url, vocab = chat_data
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    trainer_class()(model=lora_llama(vocab), args=args, train_dataset=_dataset(url)).train()
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-3", "checkpoint-4"]
    for step in (3, 4):
        state = json.loads((tmp_path / "run" / f"checkpoint-{step}" / STATE_FILE).read_text())
        assert (state["epoch"], state["batches_consumed"]) == (0, step)


def test_the_loader_state_is_in_the_checkpoint_before_it_is_pushed(
    chat_data: tuple[str, int], tmp_path: Path
) -> None:
    """With ``push_to_hub=True`` the Trainer pushes each checkpoint folder as soon as it
    has written it: the loader state must already be in it (it was written after the
    push, from ``on_save``, before). The push step is observed, not performed (offline):
    ``push_to_hub`` is set after construction, so no Hub repository is made."""
    url, vocab = chat_data
    pushed: list[list[str]] = []

    class Observed(trainer_class()):  # type: ignore[misc]
        def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
            pushed.append(sorted(os.listdir(checkpoint_folder)))

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=1,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    trainer = Observed(model=lora_llama(vocab), args=args, train_dataset=_dataset(url))
    trainer.args.push_to_hub = True
    trainer.train()
    assert len(pushed) == 2
    assert all(STATE_FILE in files and "trainer_state.json" in files for files in pushed)
    for step in (1, 2):
        state = json.loads((tmp_path / "run" / f"checkpoint-{step}" / STATE_FILE).read_text())
        assert (state["epoch"], state["batches_consumed"]) == (0, step)
