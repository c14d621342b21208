"""Peak memory of one download: RSS above idle while one object is fetched from a local
SeaweedFS into the disk tier at the default ``FetchConfig`` (16 parallel ranged GETs of
16 MiB parts).

The child process imports everything, opens the store and does one small read first
(idle = its RSS then), downloads the object through ``DiskTier.get``, and reports its
peak RSS (``VmHWM``) minus idle. Run:
``PYTHONPATH=src .venv/bin/python benchmarks/bench_download_rss.py [--size 256MB]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fastload.bench.local_s3 import LocalS3
from fastload.config import parse_size
from fastload.shards.checksum import xxh3_128
from fastload.storage import open_store

CHILD = r"""
import json, sys
from fastload.cache import DiskTier, EntryKey
from fastload.storage import open_store
cfg = json.loads(sys.argv[1])
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
store = open_store(cfg["url"], cfg["options"])
store.read_range("obj.bin", 0, 1024)  # sockets, event loop, imports: all up
tier = DiskTier(cfg["cache"])
idle = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
key = EntryKey(cfg["url"], "obj.bin", cfg["checksum"])
tier.get(key, cfg["size"], lambda f: store.download("obj.bin", f, expected_size=cfg["size"]))
print(json.dumps({"idle": idle, "peak": status("VmHWM:")}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256MB")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = parse_size(args.size)
    data = os.urandom(size)
    checksum = xxh3_128(data)
    with LocalS3(volume_size_limit_mb=1024) as s3, tempfile.TemporaryDirectory() as tmp:
        url = s3.new_url("rss")
        open_store(url, s3.storage_options).write_bytes("obj.bin", data)
        del data
        above = []
        for run in range(args.runs):
            cfg = {
                "url": url,
                "options": s3.storage_options,
                "cache": str(Path(tmp) / f"cache{run}"),
                "checksum": checksum,
                "size": size,
            }
            out = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(cfg)],
                capture_output=True,
                text=True,
                check=True,
            )
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            above.append(doc["peak"] - doc["idle"])
            print(
                f"run {run}: idle {doc['idle'] / 2**20:.1f} MiB, peak {doc['peak'] / 2**20:.1f} "
                f"MiB, above idle {above[-1] / 2**20:.1f} MiB",
                flush=True,
            )
        print(f"one {size / 1e6:.0f} MB download: max {max(above) / 2**20:.1f} MiB above idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
