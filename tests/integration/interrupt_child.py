"""Child process of ``test_interrupts.py``: KeyboardInterrupts at random instants of
real downloads, each followed by writes to a newly opened unrelated file.

Run as ``python interrupt_child.py CONFIG.json OUT.json``. For each round it arms a
one-shot timer (``setitimer``) whose SIGALRM handler raises KeyboardInterrupt in the
main thread, as Ctrl-C does, and calls ``DiskTier.get`` for a random object of the
bucket. Right after the get returns or is interrupted it opens fresh files (which
reuse the lowest free descriptors: the temp file's, if that was just closed), fills
them with a pattern, waits, and counts the 4 KiB blocks that no longer hold the pattern:
a download still writing after its caller left would show up there. The report holds
the counts; the test asserts on them and on the cache afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import sys
import time
from typing import Any, BinaryIO

from fastload.cache import DiskTier, EntryKey
from fastload.config import FetchConfig
from fastload.storage import open_store

BLOCK = 4096
BLOCKS = 256
VICTIMS = 4


def _download(store: Any, name: str, size: int, f: BinaryIO) -> None:
    store.download(name, f, expected_size=size)


def _alarm(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(cfg_path: str, out_path: str) -> None:
    with open(cfg_path) as f:
        cfg = json.load(f)
    fetch = FetchConfig(**cfg["fetch"]) if cfg.get("fetch") else None
    store = open_store(cfg["url"], cfg["storage_options"], fetch)
    tier = DiskTier(cfg["cache_dir"], cache_limit=cfg["cache_limit"], wait_deadline_s=60.0)
    rng = random.Random(cfg["seed"])
    objects: list[list[Any]] = cfg["objects"]  # [name, size, checksum]
    # warm up first: an interrupt inside a first ``import`` (aiohttp, botocore) would
    # leave a half-initialised module behind, which no library can recover from
    name, size, _ = objects[0]
    warm = os.path.join(cfg["victim_dir"], "warm.bin")
    store.download(name, warm, expected_size=size)
    t0 = time.monotonic()
    store.download(name, warm, expected_size=size)
    # interrupt instants spread over a download's duration as measured here
    max_delay = 2.5 * (time.monotonic() - t0)
    os.unlink(warm)
    signal.signal(signal.SIGALRM, _alarm)
    report: dict[str, Any] = {
        "rounds": 0,
        "interrupted": 0,
        "completed": 0,
        "stray_blocks": 0,
        "stray_rounds": [],
        "errors": [],
    }
    pattern = bytes(range(256)) * (BLOCK // 256)
    for r in range(int(cfg["rounds"])):
        name, size, checksum = rng.choice(objects)
        key = EntryKey(cfg["url"], name, checksum)
        delay = rng.uniform(0.0, max_delay)
        interrupted = False
        t0 = time.monotonic()
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, delay)
                tier.get(key, size, functools.partial(_download, store, name, size))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            interrupted = True
        except Exception as exc:  # a real failure is a test failure: report it
            report["errors"].append(f"round {r}: {type(exc).__name__}: {exc}")
        report.setdefault("times", []).append(
            [round(delay, 3), round(time.monotonic() - t0, 3), interrupted]
        )
        report["rounds"] += 1
        report["interrupted" if interrupted else "completed"] += 1
        # several fresh files: the lowest free numbers are the lock's and the temp file's
        fds = [
            os.open(
                os.path.join(cfg["victim_dir"], f"victim-{r}-{v}.bin"),
                os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                0o600,
            )
            for v in range(VICTIMS)
        ]
        try:
            for fd in fds:
                os.write(fd, pattern * BLOCKS)
            time.sleep(float(cfg["linger_s"]))  # a stray download would write meanwhile
            for fd in fds:
                got = os.pread(fd, BLOCK * BLOCKS + 1, 0)
                bad = sum(got[i * BLOCK : (i + 1) * BLOCK] != pattern for i in range(BLOCKS)) + abs(
                    len(got) - BLOCK * BLOCKS
                )
                if bad:
                    report["stray_blocks"] += bad
                    report["stray_rounds"].append([r, interrupted, bad])
        finally:
            for fd in fds:
                os.close(fd)
        for v in range(VICTIMS):
            os.unlink(os.path.join(cfg["victim_dir"], f"victim-{r}-{v}.bin"))
    tier.close()
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
