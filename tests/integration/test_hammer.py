"""The hammer: several processes read random shards (more than fit) through one capped
cache while the test SIGKILLs and interrupts (SIGINT) them at random and restarts them.
Meanwhile ``du`` of the cache directory is sampled: it never exceeds the cap; every
byte read is right; afterwards the cache verifies clean."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload.cache import DiskTier, ShardCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cache.conftest import append_line, blob, key_for

SHARDS = [(f"shard-{i:06d}.tar", blob(700 + i, 48 * 1024 + 4096 * i)) for i in range(12)]
ROOM = 6 * (48 * 1024 + 4096 * 12)  # six of the largest shards beside the metadata
PROCS = 4
RUN_S = 30.0


class _Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def _reader(root: str, report: str, seed: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts count from the loop on
    rng = random.Random(seed)
    cache = ShardCache(root, room_wait_s=30.0)
    held = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    append_line(report, f"ready {os.getpid()}")
    while True:
        try:
            name, data = rng.choice(SHARDS)

            def fetch(f: BinaryIO, data: bytes = data) -> None:
                for at in range(0, len(data), 8192):  # trickle: kills land mid-download
                    f.write(data[at : at + 8192])
                    f.flush()
                    time.sleep(0.001)

            shard = cache.open_shard("hammer", _Info(name, data), fetch)
            if bytes(shard.data) != data:
                append_line(report, f"wrong {name}")
            if rng.random() < 0.3 and not held:
                held.append(shard)  # keep one pinned for a while
            else:
                shard.close()
            if held and rng.random() < 0.2:
                held.pop().close()
            append_line(report, "ok")
        except KeyboardInterrupt:
            append_line(report, "interrupted")
            for h in held:  # what an interrupted training loop's cleanup would do
                h.close()
            held.clear()
        except Exception as exc:  # a real failure: reported, and the test fails
            append_line(report, f"error {type(exc).__name__}: {exc}".replace("\n", " "))


def _du(root: Path) -> int:
    out = subprocess.run(["du", "-sB1", str(root)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 else 0


@pytest.mark.slow
def test_hammer_kills_and_interrupts_never_break_the_cap_or_the_bytes(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    report = tmp_path / "report"
    tier = DiskTier(root)
    cap = tier.metadata_bytes(least=True) + 32 * 1024 + ROOM
    tier.set_limit(cap)
    tier.close()
    ctx = mp.get_context("spawn")
    rng = random.Random(99)
    seeds = iter(range(10_000))

    def start() -> mp.process.BaseProcess:
        p = ctx.Process(target=_reader, args=(str(root), str(report), next(seeds)))
        p.start()
        return p

    procs = [start() for _ in range(PROCS)]
    sizes: list[int] = []
    kills = interrupts = 0
    try:
        t_end = time.monotonic() + RUN_S
        next_blow = time.monotonic() + rng.uniform(0.2, 1.0)
        while time.monotonic() < t_end:
            sizes.append(_du(root))
            assert all(p.is_alive() for p in procs), "a reader died by itself"
            if time.monotonic() >= next_blow:
                k = rng.randrange(PROCS)
                if rng.random() < 0.7:
                    procs[k].kill()
                    procs[k].join(30)
                    procs[k] = start()
                    kills += 1
                elif report.exists() and f"ready {procs[k].pid}" in report.read_text():
                    # (only once its loop runs: an interrupt in a spawned child's first
                    # imports would kill the interpreter, not test the cache)
                    os.kill(procs[k].pid or 0, signal.SIGINT)
                    interrupts += 1
                next_blow = time.monotonic() + rng.uniform(0.2, 1.0)
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
            p.join(30)
    lines = report.read_text().splitlines()
    print(f"hammer: {lines.count('ok')} reads, {kills} kills, {interrupts} interrupts,")
    print(f"hammer: du at most {max(sizes)} bytes, cap {cap}")
    assert [x for x in lines if x.startswith(("wrong", "error"))] == []
    assert lines.count("ok") > 100, len(lines)
    assert kills >= 10
    assert interrupts >= 3
    assert max(sizes) <= cap, (max(sizes), cap)
    after = DiskTier(root)
    assert after.verify() == []
    assert after.usage()["total"] <= cap  # type: ignore[operator]
    assert _du(root) <= cap
    after.close()
