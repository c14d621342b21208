"""CPU of writing a file into the page cache by write size, after the memory of the
previous file was freed and (on a VM with free page reporting) handed to the host.

Why the store's downloads ``pwrite`` at most 64 KiB at a time
(:func:`fastload.storage.direct.write_piece`): each round writes ``--size`` bytes into
a new file in ``pwrite`` calls of each size in turn, deletes it, and waits
``--wait`` seconds (long enough for a free page reporting pass). Reported: system +
user CPU seconds per GB of this process for each size (median over ``--rounds``), and
the reporting passes the kernel ran meanwhile. ``--wait 0`` measures memory that was
not reported. Run:
``.venv/bin/python benchmarks/bench_page_cache_writes.py [--size 316MB] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from fastload.config import parse_size

PASSES = Path("/sys/module/page_reporting/parameters/passes")
ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
SIZES = (16 << 10, 64 << 10, 128 << 10, 1 << 20, 4 << 20)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _passes() -> int | None:
    try:
        return int(PASSES.read_text())
    except (OSError, ValueError):
        return None


def write_file(path: Path, size: int, piece: int) -> float:
    """CPU seconds to write ``size`` bytes into a new ``path``, ``piece`` per call."""
    buf = memoryview(os.urandom(piece))
    c0 = _cpu()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for pos in range(0, size, piece):
            os.pwrite(fd, buf[: min(piece, size - pos)], pos)
    finally:
        os.close(fd)
    return _cpu() - c0


def main() -> None:
    """Parse the flags, write the files, print one line per write size."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="316MB", help="bytes per file")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wait", type=float, default=4.0, help="seconds after each delete")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = p.parse_args()
    size = parse_size(args.size, "--size")
    order = ORDER.read_text().strip() if ORDER.exists() else "n/a (no free page reporting)"
    print(f"{size / 1e6:.0f} MB per file; page_reporting_order {order}; wait {args.wait} s")
    cpu: dict[int, list[float]] = {s: [] for s in SIZES}
    passes: dict[int, int] = dict.fromkeys(SIZES, 0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "f"
        for _ in range(args.rounds):
            for piece in SIZES:
                time.sleep(args.wait)
                before = _passes()
                cpu[piece].append(write_file(path, size, piece) / (size / 1e9))
                after = _passes()
                if before is not None and after is not None:
                    passes[piece] += after - before
                path.unlink()
    for piece in SIZES:
        runs = ", ".join(f"{x:.2f}" for x in cpu[piece])
        print(
            f"{piece >> 10:>5} KiB writes: {statistics.median(cpu[piece]):.2f} CPU s/GB "
            f"(rounds {runs}; reporting passes during {passes[piece]})"
        )


if __name__ == "__main__":
    main()
