"""Converting loads no dataset module (the Cityscapes tables live in
fastload.decode.cityscapes, which both import). The static half of this rule, and
every other import rule, is tests/test_house.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_converting_cityscapes_loads_no_dataset_module(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fastload import convert\n"
        "from fastload.convert.synthetic import make_cityscapes\n"
        f"root = make_cityscapes({str(tmp_path / 'cs')!r}, cities=1, per_city=2, size=(32, 16))\n"
        f"convert.cityscapes(root, {str(tmp_path / 'out')!r}, progress=False)\n"
        "bad = [m for m in sys.modules if m.startswith('fastload.datasets')]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
