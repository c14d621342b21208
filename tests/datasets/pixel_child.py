"""A child process of tests/datasets/test_pixels.py: read every sample of a dataset
through the pixel tier and compare each with a fresh decode of its raw bytes.

``python pixel_child.py <url> <cache_dir> <storage_options json> <out json> [size]``
writes ``{"pid": ..., "samples": n, "mismatches": [...], "stats": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def main() -> int:
    url, cache_dir, options, out = sys.argv[1:5]
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 24
    size = size or None  # 0: full-size decodes
    from fastload.datasets.sharded import ShardedDataset
    from fastload.decode import Decoder

    storage = json.loads(options) or None
    tiered = ShardedDataset(
        url,
        cache_dir=cache_dir,
        storage_options=storage,
        decode="tensor",
        size=size,
        pixel_cache=True,
    )
    raw = ShardedDataset(url, cache_dir=cache_dir, storage_options=storage)
    fresh = Decoder(image="tensor", size=size)
    bad = []
    for i in range(len(tiered)):
        got, want = tiered[i], fresh(raw[i])
        for name, value in want.items():
            a, b = got[name], value
            same = (
                a == b
                if isinstance(b, (str, int, bytes))
                else (tuple(a.shape) == tuple(b.shape) and np.array_equal(a.numpy(), b.numpy()))
            )
            if not same:
                bad.append(f"{i}:{name}")
    doc = {
        "pid": os.getpid(),
        "samples": len(tiered),
        "mismatches": bad,
        "stats": dict(tiered.pixels.stats) if tiered.pixels is not None else {},
    }
    tiered.close()
    raw.close()
    with open(out, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
