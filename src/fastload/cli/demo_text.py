"""``fastload demo --text``: a small synthetic text corpus, a tokenizer trained on it
offline, converted to token shards in a local S3 store, then ``fastload bench`` of it.
Called by :mod:`fastload.cli.demo`."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_demo_text"]


def run_demo_text(args: argparse.Namespace) -> int:
    """Run the text demo (documents: ``--images`` is read as the document count)."""
    from fastload.cli.bench_tokens import run_tokens
    from fastload.cli.common import say, start_local_s3
    from fastload.errors import ConfigError
    from fastload.storage import open_store
    from fastload.text import text
    from fastload.text.synthetic import make_corpus, train_tokenizer

    docs = int(args.images) * 10
    if docs < 1:
        raise ConfigError(f"--images must be >= 1, got {args.images}")
    t0 = time.perf_counter()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fastload-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    server: Any = None
    try:
        say(f"generating {docs} synthetic documents and training a tokenizer on them")
        corpus = make_corpus(docs)
        train_tokenizer(corpus[:1000], root / "tokenizer.json", vocab_size=4096)
        server = None if args.file_store else start_local_s3(root)
        if server is not None:
            server.create_bucket("demo")
            storage_options: dict[str, Any] | None = server.storage_options
            base = "s3://demo/text"
            say(f"local S3 store (SeaweedFS) at {server.endpoint_url}")
        else:
            storage_options, base = None, (root / "store" / "text").as_uri()
            say(f"using a file:// store at {base}")
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
    finally:
        if server is not None:
            server.stop(remove=False, grace_s=1.0)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s ({docs} documents)")
    return 0
