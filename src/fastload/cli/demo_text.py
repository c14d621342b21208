"""``fastload demo --text``: a small synthetic text corpus, a tokenizer trained on it
offline, converted to token shards in a local S3 store, then ``fastload bench`` of it.
Called by :mod:`fastload.cli.demo`."""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["run_demo_text"]


def run_demo_text(args: argparse.Namespace) -> int:
    """Run the text demo (documents: ``--images`` is read as the document count)."""
    from fastload.cli.bench_tokens import run_tokens
    from fastload.cli.common import DemoStore, say
    from fastload.errors import ConfigError
    from fastload.storage import open_store
    from fastload.text import text
    from fastload.text.synthetic import make_corpus, train_tokenizer

    docs = int(args.images) * 10
    if docs < 1:
        raise ConfigError(f"--images must be >= 1, got {args.images}")
    t0 = time.perf_counter()
    with DemoStore(args.keep) as where:
        root = where.root
        say(f"generating {docs} synthetic documents and training a tokenizer on them")
        corpus = make_corpus(docs)
        train_tokenizer(corpus[:1000], root / "tokenizer.json", vocab_size=4096)
        storage_options, base = where.open("text", args.file_store)
        raw = open_store(f"{base}/raw", storage_options)
        half = len(corpus) // 2
        for k, part in enumerate((corpus[:half], corpus[half:])):
            body = "".join(json.dumps({"text": d}) + "\n" for d in part).encode()
            raw.write_bytes(f"part-{k}.jsonl", body)
        url = f"{base}/tokens"
        say(f"tokenizing {base}/raw into token shards at {url}")
        report = text(f"{base}/raw", url, tokenizer=str(root / "tokenizer.json"),
                      shard_size=args.shard_size, storage_options=storage_options,
                      progress=not args.quiet and sys.stderr.isatty())  # fmt: skip
        say(report.summary())
        args.url = url
        if args.cache_dir is None:
            args.cache_dir = str(root / "cache")
        say("benchmarking the token windows through fastload.DataLoader")
        run_tokens(args, storage_options)
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s ({docs} documents)")
    return 0
