"""The GPU check script's CPU-only parts: argument parsing, the tiny dry run, JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "gpu_check.py"


@pytest.mark.slow
def test_dry_run_exits_0_and_writes_every_section(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["version"] == 1
    assert data["complete"] is True
    assert data["dry_run"] is True
    assert data["h2d"][0]["pageable_gb_s"] > 0
    assert data["feed"]["fastload_batches_s"] > 0
    assert data["feed"]["torch_batches_s"] > 0
    decode = data["dali_decode"]
    if "skipped" not in decode:
        assert decode["cpu"][0]["images"] > 0
        assert decode["cpu"][0]["img_s"] > 0
    train = data["train"]
    assert train["loader_steps"] == train["ceiling_steps"] == 3
    assert 0 <= train["wait_fraction"] <= 1
    assert train["loader_img_s"] > 0
    assert "gpu_check: wrote" in proc.stdout


def _import_script() -> Any:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check


def test_arguments_and_dry_run_sizes() -> None:
    gpu_check = _import_script()
    args = gpu_check.parse_args([])
    assert args.dali_batches == [32, 128, 256]
    assert args.budget_s < 480  # the whole run must end within 8 minutes
    tiny = gpu_check.parse_args(["--dry-run", "--out", "x"])
    assert tiny.train_batch == 4
    assert tiny.out == "x"
    explicit = gpu_check.parse_args(["--dry-run", "--feed-batches", "50", "--workers=3"])
    assert (explicit.feed_batches, explicit.workers, explicit.train_steps) == (50, 3, 3)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--skip", "nonsense"])


def test_without_cuda_a_real_run_refuses_and_says_so(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal path is for CPU-only machines")
    gpu_check = _import_script()
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "no CUDA device" in data["error"]
    assert data["complete"] is False
