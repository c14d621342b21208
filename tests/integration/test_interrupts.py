"""Interrupts (KeyboardInterrupt) at random instants of real downloads from SeaweedFS,
through a proxy that trickles the bodies.

Afterwards no file the same process opened received a stray byte (the download
coroutine was cancelled and awaited, and wrote through its own descriptor), no entry
is left FAILED by an interrupt (a cancelled download returns to ABSENT), and the cache
verifies clean with every entry byte-identical to its object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slowproxy import SlowProxy

from fastload.cache import DiskTier, EntryState
from fastload.shards.checksum import xxh3_128
from fastload.storage import open_store
from support.seaweed import SeaweedServer

pytestmark = [pytest.mark.s3, pytest.mark.slow]

CHILD = Path(__file__).resolve().parent / "interrupt_child.py"
OBJECTS = 6
SIZE = 384 * 1024


@pytest.fixture
def slow_proxy(seaweed: SeaweedServer) -> Iterator[SlowProxy]:
    proxy = SlowProxy(("127.0.0.1", seaweed.s3_port), base_options=seaweed.storage_options)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    "fetch",
    [None, {"part_size": 64 * 1024, "parallel_threshold": 128 * 1024, "concurrency": 4}],
    ids=["one-stream", "parallel-parts"],
)
def test_keyboard_interrupts_leave_no_stray_write_and_a_clean_cache(
    seaweed: SeaweedServer, slow_proxy: SlowProxy, tmp_path: Path, fetch: dict[str, Any] | None
) -> None:
    url = seaweed.new_url("objs")
    direct = open_store(url, seaweed.storage_options)
    blobs = {f"obj-{i}.bin": os.urandom(SIZE) for i in range(OBJECTS)}
    for name, data in blobs.items():
        direct.write_bytes(name, data)
    cache = tmp_path / "cache"
    victims = tmp_path / "victims"
    victims.mkdir()
    cfg = {
        "url": url,
        "storage_options": slow_proxy.storage_options,
        "cache_dir": str(cache),
        "victim_dir": str(victims),
        "objects": [[n, len(d), xxh3_128(d)] for n, d in blobs.items()],
        # room for two entries of six (beside the metadata): most rounds download
        "cache_limit": 2 * SIZE + (640 << 10),  # + the metadata (measured: 592 KiB)
        "rounds": 40,
        "linger_s": 0.05,
        "seed": 7 if fetch is None else 8,
        "fetch": fetch,
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path / "cfg.json"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["errors"] == []
    assert report["stray_blocks"] == 0
    # the instants spread over the downloads: some interrupted, some completed
    assert report["interrupted"] >= 5, report
    assert report["completed"] >= 1, report

    tier = DiskTier(cache)  # sweeps what the interrupted downloads left
    entries = tier.entries()
    assert {e.state for e in entries} <= {EntryState.READY}, entries
    assert tier.verify() == []
    for e in entries:
        assert (cache / "data" / e.name).read_bytes() == blobs[e.shard]
    assert tier.lifetime_counters().get("failures", 0) == 0
    tier.close()
    assert list((cache / "tmp").iterdir()) == []
