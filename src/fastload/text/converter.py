"""``fastload.text.text`` (also ``fastload.convert.text``): documents into token shards.

Documents come from JSONL files (plain, ``.gz``, ``.zst``), parquet files, a
directory, glob or prefix of them (on any URL :mod:`fastload.storage` opens), or a
``datasets.Dataset``. Each document is tokenized with a Hugging Face ``tokenizers``
tokenizer and followed by the EOS id: batches of 1,024 documents read in one thread
and encoded by a pool of threads (:func:`~fastload.text.tokenize_pool.encode_pipeline`,
as the first pass of :class:`~fastload.ParquetTokenDataset` does), written in order,
so the shards are those of a one-batch-at-a-time loop. The concatenated stream is
written as token shards: each shard is a WebDataset tar holding one sample with a
``tokens`` member (a flat little-endian uint16/uint32 array) and a ``docs`` member
(int64 offsets of the documents within the shard, ``0`` first and the token count
last). Documents never straddle shards.
The shards go through :class:`fastload.ShardWriter`, so they get index sidecars,
checksums and a manifest (``kind: "tokens"``) like image shards, and the manifest is
written last: a failed or interrupted run publishes nothing.

With ``chat=True`` (or a :class:`~fastload.text.chat.ChatConfig`) each record is an
instruction or chat example instead: rendered by a chat template
(:mod:`fastload.text.chat`), tokenized with a per-token loss mask and optionally
packed into blocks of ``seq_len`` tokens (:mod:`fastload.text.packing`); the shards
then carry a ``mask`` member beside the tokens, and the manifest the packing counts.

The pieces: :mod:`fastload.text.tokenizer`, :mod:`fastload.text.sources` (listing and
reading documents) and :mod:`fastload.text.writer` (token shards).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastload._args import keyword_only, renamed_keyword
from fastload.config import parse_size
from fastload.errors import ConfigError
from fastload.shards.report import ConvertReport, ErrorPolicy, finish, progress_bar
from fastload.shards.writer import ShardWriter
from fastload.text.chat import ChatConfig, load_template, render_records
from fastload.text.packing import Packer, encode_examples
from fastload.text.sources import (
    TextSource,
    dataset_documents,
    dataset_records,
    list_sources,
    read_documents,
    read_records,
)
from fastload.text.tokenize_pool import encode_pipeline
from fastload.text.tokenizer import eos_id_of, load_tokenizer, token_dtype, tokenizer_fingerprint
from fastload.text.writer import TokenShardWriter, batched_documents

_BATCH_DOCS = 1024  # documents handed to the tokenizer at once, as the one-batch loop did

__all__ = ["TextConvertReport", "text"]


@dataclass
class TextConvertReport(ConvertReport):
    """A text conversion's report: tokens and documents besides the shards."""

    @property
    def tokens(self) -> int:
        """Tokens written (EOS included)."""
        return int(self.manifest.source.get("tokens", 0))

    @property
    def documents(self) -> int:
        """Documents written (with ``chat``: examples, and padding runs)."""
        return int(self.manifest.source.get("documents", 0))

    @property
    def empty_documents(self) -> int:
        """Documents with no tokens (empty texts): left out, not written as a lone EOS."""
        return int(self.manifest.source.get("empty_documents", 0))

    @property
    def chat(self) -> dict[str, int]:
        """With ``chat``: examples read and written, truncated and dropped, tokens cut
        off, padding and trained tokens, blocks ({} without ``chat``)."""
        return dict(self.manifest.source.get("chat", {}).get("counts", {}))

    def headline(self) -> str:
        """The first line of :meth:`summary`: tokens and documents written, where (with
        ``chat``: what the packing truncated, dropped and padded)."""
        m = self.manifest
        line = (
            f"wrote {self.tokens} tokens ({m.source.get('dtype')}) of {self.documents} "
            f"documents in {len(m.shards)} shard(s), {m.total_bytes} bytes, to {m.url}"
        )
        if self.empty_documents:
            line += f"; {self.empty_documents} empty document(s) left out"
        c = self.chat
        if c:
            line += (
                f"; chat: {c['written']} of {c['examples']} examples, {c['truncated']} "
                f"truncated ({c['tokens_cut']} tokens cut), {c['dropped']} dropped, "
                f"{c['trained_tokens']} tokens trained, {c['pad_tokens']} padding"
            )
        return line

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``fastload convert text --json``."""
        return {**super().to_dict(), "tokens": self.tokens, "documents": self.documents,
                "dtype": self.manifest.source.get("dtype"), "chat": self.chat,
                "empty_documents": self.empty_documents}  # fmt: skip


@renamed_keyword("field", "text_field")
@keyword_only("tokenizer")
def text(
    sources: Any,
    out: str,
    *,
    tokenizer: Any,
    text_field: str = "text",
    eos_id: int | None = None,
    dtype: str = "auto",
    shard_size: int | str = "256MB",
    storage_options: Mapping[str, Any] | None = None,
    on_error: str = "raise",
    progress: bool = False,
    overwrite: bool = False,
    stores: dict[str, Any] | None = None,
    chat: bool | ChatConfig = False,
    chat_template: str | None = None,
) -> TextConvertReport:
    """Tokenize documents into token shards at ``out``; returns the report.

    ``sources``: a JSONL/parquet file, directory, glob or prefix (or a list of
    them), on any URL fastload opens, or a ``datasets.Dataset``; ``text_field`` is the
    text column (``field=`` is its deprecated spelling). ``tokenizer`` (by keyword; by
    position is deprecated): a ``tokenizer.json`` path or a
    ``tokenizers.Tokenizer``. Every document is followed by ``eos_id`` (default: the
    tokenizer's EOS token). ``dtype`` ``"auto"`` stores uint16 when the vocabulary
    fits. ``on_error="skip"`` leaves out bad lines/rows and lists them in the report.

    Raises :class:`SourceDataError` naming the file and line of a bad document (with
    ``on_error="raise"``), :class:`ConfigError` for bad settings or no EOS, and
    :class:`OutputExistsError` for an existing dataset at ``out`` without
    ``overwrite``; nothing is published then. With ``overwrite`` the old dataset stays
    readable until the new manifest replaces it (a failed run leaves it as it was),
    and its shards are deleted after (:class:`~fastload.ShardWriter`'s safe overwrite).
    ``stores``, if given, receives the object stores the sources were read through
    (by root URL), whose ``stats()`` count the bytes fetched.

    ``chat=True`` (or a :class:`~fastload.text.chat.ChatConfig`, which says how to
    read, mask and pack): records are instruction/chat examples (a ``messages`` list,
    prompt/response fields, or a ``text_field`` text), formatted by ``chat_template``
    (Jinja text; default: the ``chat_template`` of the ``tokenizer_config.json``
    beside the tokenizer), with a per-token loss mask stored beside the tokens; no EOS
    is appended but the template's own (``ChatConfig.add_eos``). Read them with
    ``fastload.TokenDataset(out, seq_len=..., labels="hf")``.
    """
    if chat_template is not None and chat is False:
        raise ConfigError("chat_template= formats chat data: pass chat=True with it")
    chat_cfg = ChatConfig() if chat is True else (chat or None)
    if chat_cfg is not None and not isinstance(chat_cfg, ChatConfig):
        raise ConfigError(f"chat must be a bool or a ChatConfig, got {chat!r}")
    tok = load_tokenizer(tokenizer)
    tok_path = None if not isinstance(tokenizer, (str, os.PathLike)) else os.fspath(tokenizer)
    eos = eos_id_of(tok, eos_id, tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    np_dtype = token_dtype(dtype, vocab)
    if parse_size(shard_size, "shard_size") < np_dtype.itemsize:
        raise ConfigError(f"shard_size {shard_size!r} is smaller than one token")
    policy = ErrorPolicy(on_error)
    template = None
    if chat_cfg is not None:  # a missing or broken template fails before any work
        template = load_template(chat_cfg, chat_template, tok, tok_path, eos)
        pad_id = eos if chat_cfg.pad_id is None else eos_id_of(tok, chat_cfg.pad_id)
    is_dataset = hasattr(sources, "column_names") and hasattr(sources, "iter")
    files: list[TextSource] = [] if is_dataset else list_sources(sources, storage_options)
    source_meta: dict[str, Any] = {
        "kind": "tokens",
        "dtype": np_dtype.name,
        "vocab_size": vocab,
        "eos_id": eos,
        "field": text_field,
        "tokenizer": tokenizer_fingerprint(tok),
        "sources": [s.url for s in files] if files else ["<datasets.Dataset>"],
    }
    if chat_cfg is not None:
        source_meta["mask"] = True
        if chat_cfg.seq_len is not None:
            source_meta["block_len"] = chat_cfg.seq_len
    # refuses an existing dataset unless overwrite, before any tokenizing; the old one
    # stays published until writer.close() replaces its manifest
    writer = ShardWriter(out, shard_size, storage_options, source_meta, overwrite=overwrite)
    counts: dict[str, int] = {}  # empty documents, left out (no lone EOS)
    bar = progress_bar(len(files) if files else len(sources), "tokenizing", progress)
    try:
        bar.unit = "file" if files else "doc"
        if template is not None and chat_cfg is not None:
            shards = TokenShardWriter(writer, np_dtype, flags=True)
            counts = _write_chat(
                shards, sources, files, tok, template, chat_cfg, text_field, pad_id, eos,
                np_dtype, policy, storage_options, stores, bar,
            )  # fmt: skip
            source_meta["chat"] = {
                "template_sha256": hashlib.sha256(template.source.encode()).hexdigest(),
                "train_on": chat_cfg.train_on,
                "seq_len": chat_cfg.seq_len,
                "packing": chat_cfg.packing,
                "truncation": chat_cfg.truncation,
                "pad_id": pad_id,
                "add_eos": chat_cfg.add_eos,
                "counts": counts,
            }
        else:
            if is_dataset:
                docs: Iterable[str] = dataset_documents(sources, text_field, policy)
            else:
                docs = read_documents(
                    files,
                    text_field,
                    policy,
                    storage_options,
                    on_file=lambda _src: bar.update(1),
                    stores=stores,
                )
            shards = TokenShardWriter(writer, np_dtype)
            # read in one thread, encoded by a pool of threads, written here in order
            # (fastload.text.tokenize_pool): the ids and shards of a one-batch loop
            batches = ((len(b), b) for b in batched_documents(docs, _BATCH_DOCS))
            for n, tokens, lengths in encode_pipeline(tok, batches, eos, np_dtype):
                empty = n - int(lengths.size)  # left out, not written as a lone EOS
                counts["empty_documents"] = counts.get("empty_documents", 0) + empty
                if lengths.size:
                    shards.add(tokens, lengths)
                if is_dataset:
                    bar.update(n)
        shards.close()
        source_meta.update(counts)
        source_meta.update(
            tokens=int(sum(shards.shard_tokens)),
            documents=int(sum(shards.shard_docs)),
            shard_tokens=shards.shard_tokens,
            shard_docs=shards.shard_docs,
        )
        writer.source = source_meta
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    report = finish(writer, policy, progress)
    return TextConvertReport(report.manifest, report.skipped)


def _write_chat(
    shards: TokenShardWriter,
    sources: Any,
    files: list[TextSource],
    tok: Any,
    template: Any,
    config: ChatConfig,
    text_field: str,
    pad_id: int,
    eos: int,
    dtype: Any,
    policy: ErrorPolicy,
    storage_options: Mapping[str, Any] | None,
    stores: dict[str, Any] | None,
    bar: Any,
) -> dict[str, int]:
    """Render, mask, tokenize and pack the chat records of ``sources`` into ``shards``;
    returns the packing counts."""
    if files:
        records = read_records(
            files, policy, storage_options, on_file=lambda _src: bar.update(1), stores=stores
        )
    else:
        records = dataset_records(sources)
    examples = render_records(records, template, config, text_field, policy)
    packer = Packer(config.seq_len, pad_id, config.packing, config.truncation)
    add_eos = eos if config.add_eos else None
    for batch in encode_examples(tok, examples, dtype=dtype, eos_id=add_eos):
        runs = packer.add(batch)
        if runs is not None:
            shards.add(*runs)
        if not files:
            bar.update(len(batch))
    runs = packer.finish(dtype)
    if runs is not None:
        shards.add(*runs)
    return packer.stats.to_dict()
