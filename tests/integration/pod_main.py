"""One "pod" of ``test_pods.py``: run as PID 1 of its own PID namespace
(``unshare --pid --fork --mount-proc``), sharing a cache directory with another pod.

``python pod_main.py ROLE ROOT WORK``: role ``holder`` pins shards 0 and 1 and holds
them until the reader is done, then checks their bytes; role ``reader`` reads shards 0-5
(more than the cap holds beside the pins), measuring the cache directory with ``du``
after every read. Fetches are counted in ``WORK/fetches`` (one line per fetch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cache.conftest import append_line, blob, key_for

from fastload.cache import ShardCache

SIZE = 96 * 1024
SHARDS = [(f"shard-{i:06d}.tar", blob(300 + i, SIZE)) for i in range(6)]


class Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def fetcher(work: Path, name: str, data: bytes):  # type: ignore[no-untyped-def]
    def fetch(f: BinaryIO) -> None:
        append_line(work / "fetches", f"{name} {os.getpid()}")
        f.write(data)

    return fetch


def wait_for(path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.02)


def du(root: str) -> int:
    out = subprocess.run(["du", "-sb", "--apparent-size", root], capture_output=True, text=True)
    blocks = subprocess.run(["du", "-sB1", root], capture_output=True, text=True)
    return max(int(out.stdout.split()[0]), int(blocks.stdout.split()[0]))


def main(role: str, root: str, work_dir: str) -> None:
    work = Path(work_dir)
    report: dict[str, object] = {"pid": os.getpid(), "role": role}
    cache = ShardCache(root)  # the cap is the one stored in the directory
    if role == "holder":
        held = [cache.open_shard("ds", Info(n, d), fetcher(work, n, d)) for n, d in SHARDS[:2]]
        (work / "pinned").write_text("1")
        wait_for(work / "reader-done")
        report["intact"] = [
            bytes(s.data) == d and s.path is not None and s.path.exists()
            for s, (_, d) in zip(held, SHARDS[:2], strict=True)
        ]
        for s in held:
            s.close()
    else:
        wait_for(work / "pinned")
        sizes, right = [], []
        for n, d in SHARDS:
            with cache.open_shard("ds", Info(n, d), fetcher(work, n, d)) as s:
                right.append(bytes(s.data) == d)
            sizes.append(du(root))
        report["du"] = sizes
        report["right"] = right
        (work / "reader-done").write_text("1")
    cache.close()
    (work / f"{role}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
