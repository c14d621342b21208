"""The chat snippet of ``docs/howto-lora.md`` (section 5) runs as written, with local
paths for its bucket URLs, a tiny random LLaMA for the 13B checkpoint and two
training steps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chat_helpers import chat_tokenizer, make_chats, write_chat_jsonl

from support.tiny_llama import tiny_llama

pytestmark = pytest.mark.slow

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto-lora.md"


def snippet() -> str:
    """The python block that starts with ``# howto-lora: chat``."""
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.S)
    found = [b for b in blocks if b.startswith("# howto-lora: chat")]
    assert len(found) == 1, "docs/howto-lora.md lost its chat snippet"
    return found[0]


def test_the_howto_chat_snippet_runs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    tok = chat_tokenizer(str(tmp_path / "tok"))
    write_chat_jsonl(str(tmp_path / "chat" / "a.jsonl"), make_chats(40, seed=2))
    tiny = "tiny_llama(310, seq_len=2048, heads=2, seed=None)"  # support/tiny_llama.py
    code = snippet()
    for old, new in (
        ('"s3://corpus/chat/"', repr(str(tmp_path / "chat"))),
        ('"s3://corpus/chat-tokens-2048"', repr(str(tmp_path / "tokens"))),
        ('"llama2-chat/tokenizer.json"', repr(tok)),
        ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
        ('output_dir="ckpt"', f"output_dir={str(tmp_path / 'ckpt')!r}, use_cpu=True"),
        ("max_steps=1000", "max_steps=2"),
        ("per_device_train_batch_size=8", "per_device_train_batch_size=2"),
        ('AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-chat-hf")', tiny),
    ):
        assert old in code, f"the snippet no longer says {old}"
        code = code.replace(old, new)
    scope: dict[str, object] = {"tiny_llama": tiny_llama}
    exec(compile(code, str(HOWTO), "exec"), scope)
    report = scope["report"]
    assert report.chat["written"] == 40  # type: ignore[attr-defined]
    assert (tmp_path / "tokens" / "manifest.json").exists()
