"""Batch transport benchmark (issue 9): fastload's cache transport against torch's
DataLoader, webdataset's WebLoader and the store's fetch-and-write bound, one run.

The benchmark is the package ``benchmarks/transport/`` (its docstring describes every
section); this script is the command users run:

    PYTHONPATH=src .venv/bin/python benchmarks/bench_transport.py [--images 2000]
        [--repeats 3] [--workers 2] [--batch-size 64] [--shard-size 32MB]
        [--decode-images 500] [--decode-pil-resize] [--rss-samples 2000]
        [--only warm|cold|decode|rss] [--quick]
        [--workdir DIR] [--json FILE]
"""

from __future__ import annotations

import sys

from transport.cli import main

if __name__ == "__main__":
    sys.exit(main())
