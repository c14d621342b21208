"""The converters import only downward: never the dataset layer (the Cityscapes
tables live in fastload.decode.cityscapes, which both import)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_convert_modules_do_not_import_datasets() -> None:
    for path in sorted((SRC / "fastload" / "convert").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("fastload.datasets"), (path.name, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("fastload.datasets"), (path.name, alias.name)


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
