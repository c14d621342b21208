"""A process of ``test_stopped.py``: ``python stopped_child.py ROOT URL OPTIONS_JSON NAME
SIZE CHECKSUM OUT``: opens shard ``NAME`` of the dataset at ``URL`` through a
:class:`ShardCache` at ``ROOT`` (lease 2 s), and writes to ``OUT`` whether every byte
matched (against the object read again from the store), whether it came from the disk
tier, its counters and the seconds it took."""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import BinaryIO

from fastload.cache import ShardCache
from fastload.shards.checksum import Xxh3Hasher
from fastload.storage import open_store


class Info:
    def __init__(self, name: str, size: int, checksum: str) -> None:
        self.name, self.bytes, self.checksum = name, size, checksum


def main(root: str, url: str, options: str, name: str, size: str, checksum: str, out: str) -> None:
    warnings.simplefilter("ignore", RuntimeWarning)
    store = open_store(url, json.loads(options))

    def fetch(f: BinaryIO) -> Xxh3Hasher:
        digest = Xxh3Hasher()
        store.download(name, f, expected_size=int(size), digest=digest)
        return digest

    cache = ShardCache(root, lease_s=2.0)
    t0 = time.monotonic()
    with cache.open_shard("ds", Info(name, int(size), checksum), fetch) as s:
        took = time.monotonic() - t0
        got = bytes(s.data)
        cached = s.path is not None
    assert cache.disk is not None
    st = cache.disk.counters()
    cache.close()
    report = {
        "right": got == store.read(name),
        "cached": cached,
        "took_s": took,
        "fetches": st.fetches,
        "lease_bypasses": st.lease_bypasses,
    }
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:8])
