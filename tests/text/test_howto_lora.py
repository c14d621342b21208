"""The ``accelerate`` and mixture snippets of ``docs/howto-lora.md`` run as written,
with local paths for the bucket URLs, 128-token blocks, batches of 2 and a tiny random
LoRA LLaMA for the model (the chat snippet: ``test_howto_chat.py``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_helpers import chat_tokenizer, hf_tokenizer, make_chats, write_chat_jsonl

import fastload
from fastload.text.chat import ChatConfig
from support.tiny_llama import tiny_lora

pytestmark = pytest.mark.slow

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto-lora.md"


def snippet(tag: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.S)
    found = [b for b in blocks if b.startswith(f"# howto-lora: {tag}")]
    assert len(found) == 1, f"docs/howto-lora.md lost its {tag} snippet"
    return found[0]


def _adapt(code: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        assert old in code, f"the snippet no longer says {old}"
        code = code.replace(old, new)
    return code


def _chat_tokens(tmp: Path, name: str, seed: int) -> tuple[str, int]:
    tok = chat_tokenizer(str(tmp / "tok"))
    src = write_chat_jsonl(str(tmp / f"{name}.jsonl"), make_chats(30, seed=seed, max_turns=1))
    out = str(tmp / name)
    fastload.convert.text(src, out, tokenizer=tok, chat=ChatConfig(seq_len=128))
    return out, len(hf_tokenizer(tok))


def _tiny_lora(vocab: int) -> Any:
    return tiny_lora(vocab, seq_len=128, heads=2)


def test_accelerate_snippet(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("peft")
    url, vocab = _chat_tokens(tmp_path, "chat", 4)
    ckpt = str(tmp_path / "acc")
    code = _adapt(
        snippet("accelerate"),
        [
            ('"s3://corpus/chat-tokens-2048"', repr(url)),
            ("seq_len=2048", "seq_len=128"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ("batch_size=8", "batch_size=2"),
            ("Accelerator()", "Accelerator(cpu=True)"),
            ('"ckpt/acc"', repr(ckpt)),
            ("step % 200 == 199", "step % 3 == 2"),
        ],
    )
    seen: list[list[int]] = []
    for resume in (False, True):
        model = _tiny_lora(vocab)
        model.get_base_model().register_forward_pre_hook(
            lambda _m, _a, kw: seen.extend(kw["labels"].tolist()), with_kwargs=True
        )
        scope: dict[str, Any] = {"model": model, "resume": resume}
        exec(compile(code, str(HOWTO), "exec"), scope)
        if not resume:
            full = list(seen)
            assert os.path.exists(os.path.join(ckpt, "custom_checkpoint_0.pkl"))
            state = scope["loader"].state_dict()
            seen.clear()
    # the resumed run started where the last save_state left the loader
    per_epoch = len(scope["loader"])
    assert per_epoch >= 3
    last = max(k for k in range(per_epoch) if k % 3 == 2)  # the second epoch's last save
    assert state["epoch"] == 2
    assert len(full) == 2 * per_epoch * 2
    assert seen == full[(per_epoch + last + 1) * 2 :]
    assert seen  # the resumed run had batches left to train


def test_mix_snippet(tmp_path: Path) -> None:
    a, _ = _chat_tokens(tmp_path, "a", 5)
    b, _ = _chat_tokens(tmp_path, "b", 6)
    code = _adapt(
        snippet("mix"),
        [
            ('"s3://corpus/chat-tokens-2048"', repr(a)),
            ('"s3://corpus/more-chat-tokens-2048"', repr(b)),
            ("seq_len=2048", "seq_len=128"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ("batch_size=8", "batch_size=2"),
        ],
    )
    code = code.replace("seq_len=2048", "seq_len=128")
    scope: dict[str, Any] = {}
    exec(compile(code, str(HOWTO), "exec"), scope)
    whole = [b["labels"] for b in fastload.DataLoader(scope["mix"], batch_size=2, drop_last=True)]
    rest = [b["labels"] for b in scope["resumed"]]
    assert len(whole) > 5
    assert len(rest) == len(whole) - 4
    assert all(torch.equal(x, y) for x, y in zip(rest, whole[4:], strict=True))
