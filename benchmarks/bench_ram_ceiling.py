"""The bench's RAM replay ceiling against the memory bandwidth measured in the same run.

``fastload bench`` reports a "RAM replay (ceiling)" row: the samples held in RAM,
replayed pass after pass. It used to count the bytes of each field without reading
them (a length lookup), so it reported several times the machine's memory bandwidth.
This compares, over the same samples and in one run:

* ``lengths only``: the old way (``sample_bytes`` per sample, no byte touched);
* ``every byte read``: ``fastload.bench.tiers.ram_replay`` as it is now (each field
  hashed with xxh3, which must load every byte);
* ``bandwidth``: one xxh3 pass over one buffer of the same total size, the speed at
  which one core can read memory.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_ram_ceiling.py [--seconds 0.5]``.
Prints one line per sample set with the three rates and the ratios to the bandwidth.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import xxhash

from fastload.bench.tiers import ram_replay, sample_bytes

SETS = (("300 x 70 KB (demo-sized, 21 MB)", 300, 70_000), ("4000 x 100 KB (400 MB)", 4000, 100_000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for label, n, size in SETS:
        samples = [{"__key__": str(i), "jpg": rng.bytes(size)} for i in range(n)]
        start, total = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            total += sum(sample_bytes(s) for s in samples)
        old = total / (time.perf_counter() - start) / 1e6
        new = ram_replay(samples, min_seconds=args.seconds).mb_per_s
        buffer = rng.bytes(n * size)
        start, reps = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            xxhash.xxh3_64_intdigest(buffer)
            reps += 1
        bandwidth = reps * len(buffer) / (time.perf_counter() - start) / 1e6
        print(
            f"{label}: lengths only {old:,.0f} MB/s; every byte read {new:,.0f} MB/s; "
            f"bandwidth {bandwidth:,.0f} MB/s; every byte read / bandwidth "
            f"{new / bandwidth:.2f}x, lengths only / bandwidth {old / bandwidth:.1f}x"
        )


if __name__ == "__main__":
    main()
