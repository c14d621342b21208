"""Chat data for the tests: a ChatML-style template (with and without
``{% generation %}`` marks), a tokenizer with its special tokens, generated
conversations, and the reference labels ``transformers``' ``apply_chat_template``
gives (``return_assistant_tokens_mask=True``), packed as the tests expect."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import Any

from text_helpers import make_corpus, train_tokenizer

#: ChatML with the assistant turns (content, end-of-turn and newline) marked.
MARKED = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The same template without the marks (fastload then diffs each assistant turn).
UNMARKED = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")
SPECIALS = ["<|im_start|>", "<|im_end|>"]


def chat_tokenizer(directory: str) -> str:
    """A small BPE ``tokenizer.json`` with ``<s>``, ``</s>`` and the ChatML tokens, and a
    ``tokenizer_config.json`` beside it holding :data:`MARKED`; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok = train_tokenizer(make_corpus(300, seed=1), path)
    tok.add_special_tokens(SPECIALS)
    tok.save(path)
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": MARKED}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return path


def make_chats(n: int, seed: int = 0, max_turns: int = 3) -> list[list[dict[str, str]]]:
    """``n`` conversations of 1..``max_turns`` user/assistant turns (every third with a
    system message), deterministic in ``seed``."""
    rng = random.Random(seed)
    words = make_corpus(200, seed=seed + 1)
    pool = " ".join(words).split()

    def text(k: int) -> str:
        at = rng.randrange(len(pool) - k)
        return " ".join(pool[at : at + k]) or "ok"

    chats = []
    for i in range(n):
        msgs = [{"role": "system", "content": "answer briefly"}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, max_turns)):
            msgs.append({"role": "user", "content": text(rng.randint(2, 15))})
            msgs.append({"role": "assistant", "content": text(rng.randint(2, 25))})
        chats.append(msgs)
    return chats


def write_chat_jsonl(path: str, chats: Sequence[list[dict[str, str]]]) -> str:
    """The conversations as JSONL records ``{"messages": [...]}``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for m in chats:
            f.write(json.dumps({"messages": m}) + "\n")
    return path


def hf_tokenizer(tokenizer_path: str, template: str = MARKED) -> Any:
    """The same tokenizer as ``transformers`` loads it, with ``template``."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_path, bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    tok.chat_template = template
    return tok


def reference_examples(
    hf_tok: Any, chats: Sequence[list[dict[str, str]]]
) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` of each conversation by ``apply_chat_template`` and its
    assistant mask: labels -100 off the mask and at the example's first token."""
    out = []
    for messages in chats:
        enc = hf_tok.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(enc["input_ids"])
        labels = [t if m else -100 for t, m in zip(ids, enc["assistant_masks"], strict=True)]
        labels[0] = -100
        out.append((ids, labels))
    return out


def reference_blocks(
    examples: Sequence[tuple[list[int], list[int]]], seq_len: int, pad_id: int, greedy: bool = True
) -> list[tuple[list[int], list[int], list[int]]]:
    """``(input_ids, labels, attention_mask)`` blocks of ``seq_len``: whole examples
    in order (cut to ``seq_len``), a new block when the next does not fit (or for
    each example without ``greedy``), the rest padded."""
    blocks: list[tuple[list[int], list[int], list[int]]] = []
    ids: list[int] = []
    labels: list[int] = []

    def close() -> None:
        n = seq_len - len(ids)
        blocks.append((ids + [pad_id] * n, labels + [-100] * n, [1] * len(ids) + [0] * n))

    for e_ids, e_labels in examples:
        e_ids, e_labels = e_ids[:seq_len], e_labels[:seq_len]
        if ids and (len(ids) + len(e_ids) > seq_len or not greedy):
            close()
            ids, labels = [], []
        ids, labels = ids + e_ids, labels + e_labels
    if ids:
        close()
    return blocks
