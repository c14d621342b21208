"""A LoRA fine-tune the way Hugging Face users run one: a tiny random
``LlamaForCausalLM`` built offline from a ``LlamaConfig``, a ``peft`` LoRA adapter,
``transformers.Trainer`` with its default collator, fed by
``fastload.TokenDataset(labels="hf")`` over chat examples converted by
``fastload.convert.text(chat=...)``: the loss falls, and the labels the model sees
are the reference built with ``apply_chat_template(return_assistant_tokens_mask=True)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chat_helpers import (
    chat_tokenizer,
    hf_tokenizer,
    make_chats,
    reference_blocks,
    reference_examples,
    write_chat_jsonl,
)

import fastload
from fastload import World
from fastload.text.chat import ChatConfig
from support.tiny_llama import ALL_PROJECTIONS, tiny_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow

L = 128


def _lora_llama(vocab: int) -> Any:
    # the random model's lm_head is tiny and frozen: its logits
    # stay near uniform unless it trains beside the adapter
    return tiny_lora(vocab, seq_len=L, hidden=64, attn="eager", r=8, alpha=16, dropout=0.0,
                     targets=ALL_PROJECTIONS, modules_to_save=["lm_head"])  # fmt: skip


def test_trainer_lora_on_chat_data(tmp_path: Path) -> None:
    tok_path = chat_tokenizer(str(tmp_path / "tok"))
    chats = make_chats(24, seed=11, max_turns=1)
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    report = fastload.convert.text(
        src, str(tmp_path / "out"), tokenizer=tok_path, chat=ChatConfig(seq_len=L)
    )
    ref = reference_blocks(reference_examples(hf_tokenizer(tok_path), chats), L, pad_id=2)
    assert report.chat["blocks"] == len(ref)

    ds = fastload.TokenDataset(
        str(tmp_path / "out"), seq_len=L, labels="hf", shuffle=False, world=World.single()
    )
    model = _lora_llama(len(hf_tokenizer(tok_path)))
    seen: list[list[int]] = []

    def record(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.extend(kwargs["labels"].tolist())
        assert kwargs["attention_mask"].shape == kwargs["input_ids"].shape == (4, L)

    model.get_base_model().register_forward_pre_hook(record, with_kwargs=True)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=30,
        per_device_train_batch_size=4,
        lr_scheduler_type="constant",
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        dataloader_drop_last=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds)
    trainer.train()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    # the labels the model saw: the reference blocks, epoch after epoch, in order
    per_epoch = len(ref) // 4 * 4  # dataloader_drop_last drops each epoch's short batch
    want = [ref[i % per_epoch][1] for i in range(len(seen))]
    assert seen == want


def test_trainer_checkpoint_resume_sees_the_uninterrupted_batches(tmp_path: Path) -> None:
    """Stop at a checkpoint mid-way through the second epoch of a shuffled dataset and
    resume with ``resume_from_checkpoint``: the model sees exactly the batches (labels)
    of the uninterrupted run after the checkpoint (Trainer sets the dataset's epoch;
    it skips the batches already trained within the epoch)."""
    tok_path = chat_tokenizer(str(tmp_path / "tok"))
    chats = make_chats(24, seed=11, max_turns=1)
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    fastload.convert.text(
        src, str(tmp_path / "out"), tokenizer=tok_path, chat=ChatConfig(seq_len=L)
    )
    vocab = len(hf_tokenizer(tok_path))

    def run(out: str, steps: int, resume: str | None = None) -> list[list[int]]:
        ds = fastload.TokenDataset(
            str(tmp_path / "out"),
            seq_len=L,
            labels="hf",
            shuffle=True,
            seed=5,
            world=World.single(),
        )
        model = _lora_llama(vocab)
        seen: list[list[int]] = []
        model.get_base_model().register_forward_pre_hook(
            lambda _m, _a, kw: seen.extend(kw["labels"].tolist()), with_kwargs=True
        )
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            save_strategy="steps",
            save_steps=8,
            dataloader_drop_last=True,
            seed=0,
            disable_tqdm=True,
            logging_steps=100,
        )
        transformers.Trainer(model=model, args=args, train_dataset=ds).train(
            resume_from_checkpoint=resume
        )
        return seen

    full = run(str(tmp_path / "full"), 12)
    assert len(full) == 12 * 4
    run(str(tmp_path / "part"), 8)
    rest = run(str(tmp_path / "part"), 12, resume=str(tmp_path / "part" / "checkpoint-8"))
    assert rest == full[8 * 4 :]
    assert full[: len(full) // 2] != full[len(full) // 2 :]  # epochs are shuffled apart
