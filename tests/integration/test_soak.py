"""The cache soak's one-minute version (benchmarks/soak.py; the 30-minute run's figures
are in docs/benchmarks.md): pods in PID namespaces x DataLoader workers over one cache
under a tight cap, on a small tmpfs, through the fault proxy, with random SIGKILL,
SIGSTOP/SIGCONT, Ctrl-C, re-conversion under the readers and a disk that fills and
empties. It passes only when every byte of every sample was right, the cache never
went over its cap, no pod stalled past the deadline and nothing was left behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
LINE = re.compile(
    r"^soak: (\d+) samples checked, (\d+) wrong, (\d+) kills, (\d+) stops, (\d+) faults, "
    r"peak (\d+) of cap (\d+) bytes, longest stall (\d+(?:\.\d)?) s, (\d+) leftovers$"
)


@pytest.mark.slow
@pytest.mark.torch
def test_the_one_minute_soak_holds_every_check(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", "60", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    m = LINE.match(lines[-1])
    assert m, f"last line {lines[-1]!r}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    samples, wrong, kills, stops, faults, peak, cap, stall, left = m.groups()
    report = done.stdout[-4000:]
    assert done.returncode == 0, report
    assert int(samples) > 0, report
    assert int(wrong) == 0, report
    assert int(peak) <= int(cap), report
    assert float(stall) <= 60.0, report
    assert int(left) == 0, report
    assert int(kills) + int(stops) + int(faults) > 0, report  # the faults really happened
