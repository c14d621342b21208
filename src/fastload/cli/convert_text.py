"""``fastload convert text``: tokenize JSONL/parquet documents into token shards.

Registered by :mod:`fastload.cli.convert` as one more ``convert`` kind.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastload.cli.common import (
    HelpFormatter,
    add_json_option,
    add_storage_options,
    parse_storage_options,
    print_result,
)

__all__ = ["register_text", "run_text"]


def register_text(kinds: Any) -> None:
    """Add the ``text`` kind to ``fastload convert``'s subparsers."""
    p = kinds.add_parser(
        "text",
        help="text documents (JSONL, .gz, .zst, parquet) tokenized into token shards",
        description="Tokenize every document of SOURCES with a tokenizers tokenizer.json, "
        "append the EOS id, and write the concatenated token stream as token shards "
        "(uint16 or uint32), index sidecars and manifest.json to OUT_URL. SOURCES are "
        "files, directories, globs or prefixes, local or on s3:// / cos://.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="input file, directory, glob or prefix"
    )
    p.add_argument("out", metavar="OUT_URL", help="dataset root to write (path or URL)")
    p.add_argument("--tokenizer", required=True, metavar="FILE", help="a tokenizer.json")
    p.add_argument(
        "--text-field",
        "--field",
        dest="text_field",
        default="text",
        help="the JSON field / parquet column of the text (--field: its old spelling)",
    )
    chat = p.add_argument_group(
        "chat and instruction data",
        "records with a messages list, prompt/response fields or Alpaca fields, formatted "
        "by a chat template, with a loss mask on everything but the assistant turns",
    )
    chat.add_argument("--chat", action="store_true", help="the records are chat examples")
    chat.add_argument(
        "--chat-template",
        metavar="FILE",
        default=None,
        help="a Jinja chat template file (unset: chat_template of the tokenizer_config.json "
        "beside --tokenizer)",
    )
    chat.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="pack examples into blocks of this many tokens (unset: no blocks, no padding)",
    )
    chat.add_argument("--packing", default="greedy", choices=("greedy", "none"),
                      help="greedy: whole examples fill a block; none: one per block")  # fmt: skip
    chat.add_argument("--truncation", default="right", choices=("right", "drop"),
                      help="an example longer than --seq-len: cut it, or leave it out")  # fmt: skip
    chat.add_argument("--train-on", default="assistant", choices=("assistant", "all"),
                      help="the tokens with labels")  # fmt: skip
    chat.add_argument("--add-eos", action="store_true", help="append EOS after each example")
    p.add_argument(
        "--eos-id",
        type=int,
        default=None,
        help="id appended after each document (unset: the tokenizer's EOS token)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "uint16", "uint32"),
        help="token storage type (auto: uint16 when the vocabulary fits)",
    )
    p.add_argument("--shard-size", default="256MB", help="target size of each shard")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out corrupt lines or rows and list them, instead of failing",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at OUT_URL")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_option(p)
    add_storage_options(p)
    p.set_defaults(func=run_text)


def run_text(args: argparse.Namespace) -> int:
    """Run the text conversion; print the report (or JSON) on stdout. Returns 0."""
    from fastload.text import text
    from fastload.text.chat import ChatConfig

    chat: bool | ChatConfig = False
    if args.chat:
        template = None
        if args.chat_template is not None:
            with open(args.chat_template, encoding="utf-8") as f:
                template = f.read()
        chat = ChatConfig(
            template=template,
            seq_len=args.seq_len,
            packing=args.packing,
            truncation=args.truncation,
            train_on=args.train_on,
            add_eos=args.add_eos,
        )
    report = text(
        args.sources,
        args.out,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        chat=chat,
        eos_id=args.eos_id,
        dtype=args.dtype,
        shard_size=args.shard_size,
        storage_options=parse_storage_options(args.storage_options),
        on_error="skip" if args.skip_bad else "raise",
        progress=not args.quiet and sys.stderr.isatty(),
        overwrite=args.overwrite,
    )
    print_result(args, {"command": "convert", **report.to_dict()}, [report.summary()])
    return 0
