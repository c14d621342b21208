"""``fastload demo`` end to end in a subprocess: table, verdict, exit 0, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload.bench.report import figures_problems

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "fastload", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow
def test_demo_on_seaweedfs(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    keep = tmp_path / "kept"
    proc = _run("--images", "60", "--quiet", "--json", str(out), "--keep", str(keep))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tier" in proc.stdout
    assert "warm epoch (NVMe cache)" in proc.stdout
    assert "baseline: GET per sample" in proc.stdout
    assert "\nbottleneck: " in proc.stdout
    assert "demo finished in" in proc.stdout
    assert "local S3 store (SeaweedFS)" in proc.stderr
    report = json.loads(out.read_text())
    assert figures_problems(report) == []
    assert report["demo"]["store"] == "seaweedfs"
    assert report["dataset"]["samples"] == 60
    assert report["baseline"]["kind"] == "objects"
    assert (keep / "coco" / "annotations").is_dir()  # --keep keeps the data
    assert (keep / "s3" / "data").is_dir()  # and the store's files


@pytest.mark.slow
def test_demo_on_a_file_store_removes_its_temp_dir(tmp_path: Path) -> None:
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(env_tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "demo",
            "--images",
            "20",
            "--file-store",
            "--quiet",
            "--epochs",
            "1",
            "--no-baseline",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "file:// store" in proc.stderr
    assert "\nbottleneck: " in proc.stdout
    assert list(env_tmp.iterdir()) == []  # the demo's temp dir is gone


def _weed_pids_under(path: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "weed" in cmdline and str(path) in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_demo_stops_the_server_and_removes_its_files(
    tmp_path: Path, sig: signal.Signals
) -> None:
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(env_tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastload", "demo", "--images", "400", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 90
    for line in proc.stderr:  # wait until the server is up, then interrupt
        lines.append(line)
        if "converting to shards" in line or time.monotonic() > deadline:
            break
    assert _weed_pids_under(env_tmp), "".join(lines)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + err
    assert "interrupted" in err
    assert _weed_pids_under(env_tmp) == []
    assert list(env_tmp.iterdir()) == []
