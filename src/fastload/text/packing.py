"""Chat examples into tokens, per-token flags and packed blocks.

:func:`encode_examples` tokenizes rendered examples in batches (``add_special_tokens``
off: the template wrote the special tokens it wants, as ``apply_chat_template``
tokenizes) and marks a token trained when its characters meet a span to train on
(the tokens from the one holding a span's first character to the one holding its
last, as ``transformers`` turns ``{% generation %}`` spans into
``assistant_masks``). :class:`Packer` cuts the examples into blocks of ``seq_len``
tokens (see :class:`~fastload.text.chat.ChatConfig`) and counts what it truncated,
dropped and padded.

Flags, one uint8 per token, stored beside the tokens (the ``mask`` member of a token
shard): :data:`TRAIN` (bit 0) the token is a label to train on, :data:`PAD` (bit 1)
the token is padding (``attention_mask`` 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.errors import ConfigError

__all__ = ["PAD", "TRAIN", "PackStats", "Packer", "encode_examples"]

TRAIN = 1
PAD = 2
_BATCH = 1024  # examples handed to the tokenizer at once

Example = tuple[str, list[tuple[int, int]]]  # rendered text, character spans to train on


def _token_flags(enc: Any, n: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """TRAIN on the tokens from the one holding each span's first character to the one
    holding its last (``char_to_token``: no per-token work); where a span's end
    character belongs to no token (trimmed whitespace), every token whose characters
    meet the span."""
    flags = np.zeros(n, dtype=np.uint8)
    offsets = None
    for a, b in spans:
        if b <= a or not n:
            continue
        first, last = enc.char_to_token(a), enc.char_to_token(b - 1)
        if first is not None and last is not None:
            flags[first : last + 1] = TRAIN
            continue
        if offsets is None:
            offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        flags[(offsets[:, 0] < b) & (offsets[:, 1] > a)] = TRAIN
    return flags


def encode_examples(
    tokenizer: Any,
    examples: Iterable[Example],
    *,
    dtype: np.dtype[Any],
    eos_id: int | None = None,
) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
    """Tokenize ``examples`` in batches: yields, per batch, ``(ids, flags)`` for each
    example (``ids`` in ``dtype``, ``flags`` uint8), ``eos_id`` appended and trained
    when given. Raises :class:`ConfigError` when an id does not fit ``dtype``."""
    if eos_id is not None and eos_id > np.iinfo(dtype).max:
        raise ConfigError(f"token id {eos_id} does not fit in {dtype.name}")

    def encode(batch: list[Example]) -> list[tuple[np.ndarray, np.ndarray]]:
        encodings = tokenizer.encode_batch([t for t, _ in batch], add_special_tokens=False)
        out = []
        for (_, spans), enc in zip(batch, encodings, strict=True):
            try:
                ids = np.asarray(enc.ids, dtype=dtype)
            except OverflowError:  # numpy refuses a Python int out of the dtype's range
                raise ConfigError(f"a token id does not fit in {dtype.name}") from None
            flags = _token_flags(enc, ids.size, spans)
            if eos_id is not None:
                ids = np.append(ids, np.asarray(eos_id, dtype=dtype))
                flags = np.append(flags, np.uint8(TRAIN))
            out.append((ids, flags))
        return out

    # no reader thread ahead of the tokenizer: the tokenizer's own threads use every
    # core, and on the 2-core benchmark machine a render thread beside them measured
    # slower (benchmarks/bench_chat_pack.py: 0.62x of plain packing against 0.95-1.07x)
    batch: list[Example] = []
    for example in examples:
        batch.append(example)
        if len(batch) >= _BATCH:
            yield encode(batch)
            batch = []
    if batch:
        yield encode(batch)


@dataclass
class PackStats:
    """What packing did: examples in and written, truncated (cut to ``seq_len``) and
    dropped (``truncation="drop"``, or empty), the tokens cut off, padding tokens, and
    tokens trained on."""

    examples: int = 0
    written: int = 0
    truncated: int = 0
    dropped: int = 0
    tokens_cut: int = 0
    pad_tokens: int = 0
    trained_tokens: int = 0
    blocks: int = 0

    def to_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for the manifest and the report)."""
        return {k: int(v) for k, v in self.__dict__.items()}


@dataclass
class Packer:
    """Examples into token runs for a :class:`~fastload.text.writer.TokenShardWriter`
    (see :class:`~fastload.text.chat.ChatConfig` for the policies). ``seq_len`` None:
    examples follow each other unpadded."""

    seq_len: int | None
    pad_id: int
    packing: str = "greedy"
    truncation: str = "right"
    stats: PackStats = field(default_factory=PackStats)

    def __post_init__(self) -> None:
        self._fill = 0  # tokens in the open block

    def _pad(self, dtype: np.dtype[Any], out: list[tuple[np.ndarray, np.ndarray]]) -> None:
        if self.seq_len is None or not self._fill:
            return
        n = self.seq_len - self._fill
        if n:
            out.append((np.full(n, self.pad_id, dtype=dtype), np.full(n, PAD, dtype=np.uint8)))
            self.stats.pad_tokens += n
        self._fill = 0
        self.stats.blocks += 1

    def add(
        self, examples: list[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Pack a batch of ``(ids, flags)`` examples: ``(tokens, lengths, flags)`` of the
        runs to write now (each example, and each padding run, a document; the open
        block's runs are written as they come, since the block is filled in order), or
        None when there are none."""
        runs: list[tuple[np.ndarray, np.ndarray]] = []
        L = self.seq_len
        st = self.stats
        for ids, flags in examples:
            st.examples += 1
            if not ids.size:
                st.dropped += 1
                continue
            if L is not None and ids.size > L:
                st.truncated += 1
                if self.truncation == "drop":
                    st.dropped += 1
                    st.tokens_cut += int(ids.size)
                    continue
                st.tokens_cut += int(ids.size) - L
                ids, flags = ids[:L], flags[:L]
            if L is not None and (self._fill + ids.size > L or self.packing == "none"):
                self._pad(ids.dtype, runs)
            runs.append((ids, flags))
            st.written += 1
            if L is not None:
                self._fill += int(ids.size)
        return self._emit(runs)

    def finish(self, dtype: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Pad the last open block; its runs to write, or None."""
        runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._pad(dtype, runs)
        return self._emit(runs)

    def _emit(
        self, runs: list[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not runs:
            return None
        tokens = np.concatenate([r[0] for r in runs])
        flags = np.concatenate([r[1] for r in runs])
        self.stats.trained_tokens += int(np.count_nonzero(flags & TRAIN))
        lengths = np.fromiter((r[0].size for r in runs), dtype=np.int64, count=len(runs))
        return tokens, lengths, flags
