"""The tiny random LLaMA-architecture models of the Hugging Face tests, built offline
from a ``transformers.LlamaConfig`` (no hub): 2 layers, ``hidden`` wide, an MLP twice
that, ``heads`` attention heads (as many key/value heads), optionally with a ``peft``
LoRA adapter. One builder for ``tests/text/test_hf*.py``, ``test_lora*.py``,
``test_howto*.py`` and the ranks and scripts they start (``transformers``/``peft``
import torchvision: in a child process register ``support.torchvision_shim`` first, or
run it with ``PYTHONPATH`` holding ``tests/support/site``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: LoRA on every projection of a LLaMA block.
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama(
    vocab: int,
    *,
    seq_len: int,
    hidden: int = 32,
    heads: int = 4,
    attn: str | None = None,
    seed: int | None = 0,
) -> Any:
    """A random ``LlamaForCausalLM`` for ``vocab`` tokens and windows up to ``seq_len``
    (``attn``: its ``attn_implementation``, the library's default when None; ``seed``:
    ``torch.manual_seed`` before the weights are drawn, none when None)."""
    import torch
    import transformers

    if seed is not None:
        torch.manual_seed(seed)
    extra = {} if attn is None else {"attn_implementation": attn}
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=seq_len,
        **extra,
    )
    return transformers.LlamaForCausalLM(config)


def tiny_lora(
    vocab: int,
    *,
    seq_len: int,
    hidden: int = 32,
    heads: int = 4,
    attn: str | None = None,
    r: int = 4,
    alpha: int = 8,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    task_type: str | None = "CAUSAL_LM",
    dropout: float | None = None,
    modules_to_save: Sequence[str] | None = None,
) -> Any:
    """:func:`tiny_llama` (seed 0) with a ``peft`` LoRA adapter of rank ``r`` on
    ``targets`` (``task_type`` None: a plain ``PeftModel``)."""
    import peft

    extra: dict[str, Any] = {}
    if dropout is not None:
        extra["lora_dropout"] = dropout
    if modules_to_save is not None:
        extra["modules_to_save"] = list(modules_to_save)
    if task_type is not None:
        extra["task_type"] = task_type
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), **extra)
    model = tiny_llama(vocab, seq_len=seq_len, hidden=hidden, heads=heads, attn=attn)
    return peft.get_peft_model(model, lora)
