"""The demo output in docs/getting-started.md is what the current code prints.

The page shows the table of a real ``fastload demo`` run whose report is stored
beside it (``docs/bench-demo.json``). Rendering that report with today's
:func:`render_table` must give the page's text exactly, and a fresh demo run must
print ``render_table`` of its own report and write a report of the same shape, so
the page cannot drift from the code. When the table changes on purpose, rerun
``fastload demo --images 60 --quiet --workers 2 --json docs/bench-demo.json`` and
paste its stdout into the page.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastload.bench.report import figures_problems, render_table

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
REPORT = REPO / "docs" / "bench-demo.json"
_FINISH = re.compile(r"demo finished in \d+\.\d s \((seaweedfs|file) store, (\d+) images\)")


def _demo_block() -> str:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(r"```text\n(dataset: .*?)\n```", text, re.DOTALL)
    assert match, "docs/getting-started.md has no demo output block"
    return match.group(1)


def _split_finish(stdout: str) -> tuple[str, re.Match[str]]:
    table, _, last = stdout.rstrip("\n").rpartition("\n\n")
    finish = _FINISH.fullmatch(last)
    assert finish, f"not the demo's last line: {last!r}"
    return table, finish


def test_the_page_shows_what_render_table_prints_for_its_report() -> None:
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    assert figures_problems(report) == []
    table, finish = _split_finish(_demo_block())
    assert table == render_table(report)
    assert finish.group(1) == report["demo"]["store"]
    assert int(finish.group(2)) == report["demo"]["images"]


def _shape(doc: Any, depth: int = 2) -> Any:
    """The keys of ``doc`` down to ``depth`` levels (values left out)."""
    if isinstance(doc, dict) and depth > 0:
        return {k: _shape(v, depth - 1) for k, v in doc.items()}
    return None


@pytest.mark.slow
def test_a_fresh_demo_prints_its_report_in_the_shape_the_page_has(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", "demo", "--images", "20", "--quiet",
         "--workers", "2", "--epochs", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    table, finish = _split_finish(proc.stdout)
    assert table == render_table(report)
    assert int(finish.group(2)) == 20
    stored = json.loads(REPORT.read_text(encoding="utf-8"))
    fresh_shape, stored_shape = _shape(report), _shape(stored)
    for key in ("machine", "bottleneck"):  # facts and verdicts vary by machine and run
        fresh_shape.pop(key)
        stored_shape.pop(key)
    for tier in ("remote", "disk", "ram", "loader"):
        assert fresh_shape[tier] == stored_shape[tier], tier
    assert set(fresh_shape) == set(stored_shape)
    assert fresh_shape["settings"] == stored_shape["settings"]
