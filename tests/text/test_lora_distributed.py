"""A plain LoRA training loop under torchrun's environment, 2 ranks (gloo, CPU), over
chat data converted to SeaweedFS: stopped after some steps (loader state, adapter and
optimizer saved) and resumed in new processes, each rank trains on exactly the batches
of the uninterrupted run, and its loader serves only the batches after the stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chat_helpers import chat_tokenizer, hf_tokenizer, make_chats, write_chat_jsonl

import fastload
from fastload.text.chat import ChatConfig
from support.ranks import run_ranks

pytest.importorskip("transformers")
pytest.importorskip("peft")

RANK_MAIN = Path(__file__).with_name("lora_rank_main.py")
L = 64

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_two_rank_lora_loop_stops_and_resumes_exactly(seaweed: Any, tmp_path: Path) -> None:
    tok = chat_tokenizer(str(tmp_path / "tok"))
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), make_chats(40, seed=3, max_turns=1))
    url = seaweed.new_url("lora")
    fastload.convert.text(src, url, tokenizer=tok, chat=ChatConfig(seq_len=L),
                          storage_options=seaweed.storage_options)  # fmt: skip
    cfg = {"url": url, "seq_len": L, "vocab": len(hf_tokenizer(tok)), "epochs": 2,
           "storage_options": seaweed.storage_options, "ckpt": str(tmp_path / "ckpt")}  # fmt: skip
    (tmp_path / "ckpt").mkdir()

    def run(tag: str, **extra: Any) -> list[dict[str, Any]]:
        return run_ranks(RANK_MAIN, tmp_path, tag, 1, 2, {**cfg, **extra}, timeout=400)

    full = run("full")
    per_epoch = full[0]["per_epoch"]
    assert per_epoch >= 3
    assert all(r["batches"] == 2 * per_epoch for r in full)
    stop = per_epoch + 1
    part = run("part", stop=stop)
    rest = run("rest", resume=True, done=stop)
    for f, p, r in zip(full, part, rest, strict=True):
        assert p["labels"] == f["labels"][: stop * 2]
        assert r["labels"] == f["labels"][stop * 2 :]
        assert r["batches"] == 2 * per_epoch - stop  # nothing skipped by reading it
        # the same model state: the resumed losses are the uninterrupted run's
        # (a batch with no trained token has a NaN loss in both)
        assert r["losses"] == pytest.approx(f["losses"][stop:], rel=1e-4, nan_ok=True)
    # within an epoch the two ranks trained on different windows
    first = [{tuple(x) for x in r["labels"][: per_epoch * 2] if set(x) != {-100}} for r in full]
    assert first[0]
    assert first[1]
    assert not first[0] & first[1]
