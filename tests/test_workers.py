"""One rule for default pool sizes: fastload.config.default_workers over the CPUs this
process may run on (its affinity mask), not the machine's count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastload.config import WORKER_DEFAULTS, default_workers, usable_cpus
from fastload.errors import ConfigError


def test_every_pool_default_follows_its_row() -> None:
    n = usable_cpus()
    for kind, (per_cpu, cap) in WORKER_DEFAULTS.items():
        assert default_workers(kind) == max(1, min(cap, per_cpu * n))


def test_an_unknown_pool_is_named() -> None:
    with pytest.raises(ConfigError, match="'decode'.*adopt"):
        default_workers("decode")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here")
def test_the_affinity_mask_counts_not_the_machine() -> None:
    # a process pinned to one CPU (a container's or taskset's share) sizes its pools for it
    code = (
        "import os\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "from fastload.config import default_workers, usable_cpus\n"
        "from fastload.convert._common import default_workers as convert_default\n"
        "print(usable_cpus(), default_workers('convert'), default_workers('adopt'),"
        " default_workers('loader'), convert_default())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "2", "4", "1", "2"]
