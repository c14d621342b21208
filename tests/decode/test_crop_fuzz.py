"""A short run of the JPEG region decoder's fuzz harness (fuzz/run_jpeg.sh) under
ASan/UBSan: mutated JPEGs of every layout end in a clean error or a full region."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fastload import _native

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("clang++") is None and shutil.which("g++") is None,
    reason="needs a C++ compiler (clang++ or g++) to build the harness",
)
@pytest.mark.skipif(
    not getattr(_native, "HAVE_JPEG", False),
    reason="built without libjpeg-turbo: there is no native decoder to fuzz",
)
def test_jpeg_fuzz_harness_short_run(tmp_path: Path) -> None:
    env = {**os.environ, "FUZZ_WORK": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(ROOT / "fuzz" / "run_jpeg.sh"), "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout + proc.stderr
    assert "no crash" in out or "Done " in out
    assert len(list((tmp_path / "jpeg" / "seeds").glob("*.jpg"))) == 10
