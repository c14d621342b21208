#!/usr/bin/env python3
"""GPU check for fastload: every figure of the device sections in one short run.

Sections, in order, each under its own ``try`` (a failure records its traceback and
the run goes on; the exit status is 1 if any section failed):

* ``env``: versions, GPU, what is importable (torchvision, DALI, the C++ extension);
* ``shm``: ``/dev/shm`` size against what the workers' batches need; the worker count
  and prefetch depth are lowered to fit (the fallback is recorded);
* ``h2d``: pageable vs pinned host-to-device GB/s against a plain ``cudaMemcpy``
  ceiling measured in the same run;
* ``loader``: ``fastload.DataLoader(device=...)`` without workers (its own pinned pool,
  side stream, CUDA events) and with workers (torch's pin thread) vs torch's
  DataLoader recipe, and a ``PackedBytes`` field through the pool;
* ``decode``: nvJPEG img/s at batch 32/128/256 (torchvision; DALI too when importable)
  vs fastload's CPU path in a thread per core, and the GPU pixels vs the CPU path's;
* ``train``: the fraction of a ResNet-50 bf16 step spent waiting for data, torch's
  DataLoader (baseline) vs fastload's (CPU decode, and nvJPEG), over an epoch longer
  than the timed window (see ``gpu_train.py``);
* ``device_tests``: the device tests (``tests/loader/test_loader_device.py``,
  ``tests/gpu/test_nvjpeg.py``, ``tests/gpu/test_bench_nvjpeg.py``, ``tests/dali``) by
  pytest in a subprocess, when pytest is importable.

``<out>/gpu_check.json`` is rewritten after every section. The run keeps its own
budget (``--budget-s``; a section that would not fit is skipped) and a hard guard
20 s past it that writes the JSON and exits 3, both inside ``run.sh``'s timeout.
Needs only torch, numpy and Pillow (``PYTHONPATH=src``, no fastload install, no C++
extension, no network). ``--dry-run`` runs tiny CPU versions of every section
(``tests/gpu/test_gpu_check.py`` runs it in CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

RESULT_VERSION = 2
ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("env", "shm", "h2d", "loader", "decode", "train", "device_tests")
# seconds a section needs at least; with less left it is skipped
MIN_SECONDS = {"h2d": 15, "loader": 30, "decode": 30, "train": 60, "device_tests": 30}
DEVICE_TESTS = (
    "tests/loader/test_loader_device.py",
    "tests/gpu/test_nvjpeg.py",
    "tests/gpu/test_bench_nvjpeg.py",
    "tests/dali",
)
GUARD_S = 20


class Budget:
    """The run's deadline."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Report:
    """The JSON document, written atomically after every change."""

    def __init__(self, path: Path, argv: list[str], dry_run: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "version": RESULT_VERSION,
            "command": " ".join(["benchmarks/gpu/gpu_check.py", *argv]),
            "dry_run": dry_run,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "complete": False,
            "running": None,
            "sections": {},
        }

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path)

    def section(self, name: str, value: dict[str, Any]) -> None:
        self.data["sections"][name] = value
        self.write()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    cpus = os.cpu_count() or 1
    p.add_argument("--out", default=".", help="directory for gpu_check.json")
    p.add_argument("--dry-run", action="store_true", help="tiny CPU versions of every section")
    p.add_argument("--budget-s", type=float, default=300.0, help="the run's own time budget")
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--copy-repeats", type=int, default=20)
    p.add_argument("--decode-batches", type=int, nargs="+", default=[32, 128, 256])
    p.add_argument("--decode-images", type=int, default=256, help="distinct JPEGs")
    p.add_argument("--decode-iters", type=int, default=20, help="timed calls per batch size")
    p.add_argument("--train-batch", type=int, default=256)
    p.add_argument("--train-steps", type=int, default=30, help="timed steps per feed")
    p.add_argument("--train-warmup", type=int, default=5)
    p.add_argument("--feed-batches", type=int, default=40, help="batches per loader run")
    p.add_argument("--workers", type=int, default=max(1, min(12, cpus - 2)))
    p.add_argument("--prefetch", type=int, default=4, help="prefetch_factor with workers")
    p.add_argument("--skip", nargs="*", default=[], choices=SECTIONS[1:], help="sections to skip")
    p.add_argument("--tests", nargs="*", default=list(DEVICE_TESTS), help="device test paths")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options; with ``--dry-run`` every option left at its default is made tiny."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dry_run:
        given = {
            a.dest
            for a in parser._actions
            for o in a.option_strings
            if any(x == o or x.startswith(o + "=") for x in argv)
        }
        tiny = {
            "budget_s": 200.0,
            "sizes_mb": [0.25],
            "copy_repeats": 2,
            "decode_batches": [4, 8],
            "decode_images": 8,
            "decode_iters": 2,
            "train_batch": 4,
            "train_steps": 3,
            "train_warmup": 1,
            "feed_batches": 4,
            "workers": 2,
            "prefetch": 2,
        }
        for name, value in tiny.items():
            if name not in given:
                setattr(args, name, value)
    return args


# ------------------------------------------------------------ small sections
def importable(name: str) -> bool:
    """Whether ``name`` can be found (``find_spec`` raises when a parent is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def env_section(torch: Any) -> dict[str, Any]:
    import numpy
    import PIL

    import fastload

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "pillow": PIL.__version__,
        "fastload_from": str(Path(fastload.__file__).parent),
        "fastload_native": importable("fastload._native"),
        "dali": importable("nvidia.dali"),
        "pytest": importable("pytest"),
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except Exception as exc:  # missing, or built for another torch
        facts["torchvision"] = None
        facts["torchvision_error"] = f"{type(exc).__name__}: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gb=props.total_memory / 1e9,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    return facts


def shm_plan(
    free_bytes: int | None, workers: int, prefetch: int, batch_bytes: int
) -> tuple[int, int, str | None]:
    """Workers and prefetch depth whose batches in flight (twice, for the copies torch
    makes) fit in 80% of ``/dev/shm``'s free space; ``None`` free means no /dev/shm."""
    if workers == 0:
        return 0, prefetch, None
    if free_bytes is None:
        return 0, prefetch, "no /dev/shm: no workers"

    def need(w: int, p: int) -> int:
        return 2 * w * p * batch_bytes

    w, p = workers, prefetch
    while need(w, p) > 0.8 * free_bytes and p > 2:
        p -= 1
    while need(w, p) > 0.8 * free_bytes and w > 1:
        w //= 2
    if need(w, p) > 0.8 * free_bytes:
        return 0, p, f"/dev/shm too small ({free_bytes / 1e9:.2f} GB free): no workers"
    if (w, p) != (workers, prefetch):
        return w, p, f"/dev/shm {free_bytes / 1e9:.2f} GB free: workers {w}, prefetch {p}"
    return w, p, None


def shm_section(args: argparse.Namespace, image_size: int) -> dict[str, Any]:
    batch_bytes = args.train_batch * 3 * image_size * image_size
    try:
        st = os.statvfs("/dev/shm")
        free: int | None = st.f_bavail * st.f_frsize
        total: int | None = st.f_blocks * st.f_frsize
    except OSError:
        free = total = None
    w, p, fallback = shm_plan(free, args.workers, args.prefetch, batch_bytes)
    out = {
        "total_gb": None if total is None else total / 1e9,
        "free_gb": None if free is None else free / 1e9,
        "needed_gb": 2 * args.workers * args.prefetch * batch_bytes / 1e9,
        "asked": {"workers": args.workers, "prefetch": args.prefetch},
        "workers": w,
        "prefetch": p,
        "fallback": fallback,
    }
    args.workers, args.prefetch = w, p  # what the later sections use
    return out


def device_tests_section(
    paths: list[str], out_dir: Path, dry_run: bool, time_left: Callable[[], float]
) -> dict[str, Any]:
    """The device tests by pytest in a subprocess (``-m gpu`` in the dry run, where they
    skip: the call itself is what the dry run checks)."""
    if not importable("pytest"):
        return {
            "status": "skipped",
            "reason": "pytest is not importable (run.sh unpacks benchmarks/gpu/.wheels)",
        }
    xml = out_dir / "device_tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--noconftest",  # the suite's conftest needs the S3 test server's packages
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        f"--junitxml={xml}",
        *(["-m", "gpu"] if dry_run else []),
        *paths,
    ]
    timeout = max(10.0, min(180.0, time_left() - 5))
    # plain pytest, as on the device machine: no plugins from this environment's packages
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:]
        return {"status": "error", "reason": f"pytest ran past {timeout:.0f} s", "tail": tail}
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode}
    try:
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        assert suite is not None
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["passed"] = (
            counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        )
        out.update(counts)
        out["failed"] = [
            f"{case.get('classname')}::{case.get('name')}"
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
    except (OSError, ET.ParseError, AssertionError) as exc:
        out["junit_error"] = str(exc)
    out["tail"] = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode not in (0, 5):  # 5: nothing collected
        out["status"] = "error"
    return out


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    out_dir = Path(args.out)
    report = Report(out_dir / "gpu_check.json", argv, args.dry_run)
    report.write()

    def stop(reason: str, code: int) -> None:
        running = report.data.get("running")
        if running:
            report.data["sections"][running] = {"status": "error", "reason": reason}
        report.data["error"] = f"{reason} after {budget.elapsed():.0f} s"
        report.write()
        print(f"gpu_check: {reason}; partial results in {report.path}", file=sys.stderr)
        os._exit(code)

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        stop("hard time guard", 3)

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop("terminated (SIGTERM, the outer timeout)", 143)

    previous = {
        s: signal.signal(s, h) for s, h in [(signal.SIGALRM, on_alarm), (signal.SIGTERM, on_term)]
    }
    signal.alarm(int(args.budget_s) + GUARD_S)
    try:
        return run(args, budget, report)
    finally:
        signal.alarm(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace, budget: Budget, report: Report) -> int:
    import torch

    cuda = torch.cuda.is_available()
    if not args.dry_run and not cuda:
        report.data["error"] = "no CUDA device; use --dry-run for the CPU check"
        report.write()
        print("gpu_check: no CUDA device (use --dry-run)", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    image_size = 32 if args.dry_run else 224
    jpeg_size = (64, 48) if args.dry_run else (640, 480)
    state: dict[str, Any] = {}
    import gpu_data
    import gpu_sections
    import gpu_train

    def jpegs() -> list[bytes]:
        if "blobs" not in state:
            t0 = time.monotonic()
            state["blobs"] = gpu_data.jpeg_bytes(args.decode_images, *jpeg_size)
            report.data["jpegs"] = {
                "count": len(state["blobs"]),
                "size": list(jpeg_size),
                "seconds": round(time.monotonic() - t0, 2),
            }
        return state["blobs"]  # type: ignore[no-any-return]

    tmp = tempfile.TemporaryDirectory(prefix="fastload-gpu-check-")
    left = budget.left
    bodies: dict[str, Callable[[], dict[str, Any]]] = {
        "env": lambda: env_section(torch),
        "shm": lambda: shm_section(args, image_size),
        "h2d": lambda: gpu_sections.h2d_section(
            torch, device, args.sizes_mb, args.copy_repeats, left
        ),
        "loader": lambda: gpu_sections.loader_section(
            torch,
            device,
            image_size=image_size,
            batch_size=args.train_batch,
            batches=args.feed_batches,
            workers=args.workers,
            prefetch=args.prefetch,
            time_left=left,
        ),
        "decode": lambda: gpu_sections.decode_section(
            torch,
            device,
            jpegs(),
            batch_sizes=args.decode_batches,
            iters=args.decode_iters,
            size=image_size,
            tmpdir=tmp.name,
            time_left=left,
        ),
        "train": lambda: gpu_train.train_section(
            torch,
            device,
            jpegs(),
            image_size=image_size,
            batch_size=args.train_batch,
            steps=args.train_steps,
            warmup=args.train_warmup,
            workers=args.workers,
            prefetch=args.prefetch,
            tiny=args.dry_run,
            time_left=left,
        ),
        "device_tests": lambda: device_tests_section(
            args.tests, Path(args.out), args.dry_run, left
        ),
    }
    failed = []
    for name in SECTIONS:
        if name in args.skip:
            report.section(name, {"status": "skipped", "reason": "--skip"})
            continue
        need = MIN_SECONDS.get(name, 0)
        if budget.left() < need:
            reason = f"time budget ({budget.left():.0f} s left, needs {need} s)"
            report.section(name, {"status": "skipped", "reason": reason})
            continue
        report.data["running"] = name
        report.write()
        t0 = time.monotonic()
        try:
            value = bodies[name]()
            value.setdefault("status", "ok")
        except Exception:
            value = {"status": "error", "traceback": traceback.format_exc()}
        value["seconds"] = round(time.monotonic() - t0, 2)
        report.data["running"] = None
        report.section(name, value)
        if value["status"] == "error":
            failed.append(name)
        print(f"gpu_check: {name}: {value['status']} ({value['seconds']} s)", flush=True)
        print(json.dumps(value, default=str)[:4000], flush=True)
    tmp.cleanup()
    report.data["summary"] = summary(report.data["sections"])
    report.data["failed_sections"] = failed
    report.data["elapsed_s"] = round(budget.elapsed(), 1)
    report.data["complete"] = True
    report.write()
    print(f"gpu_check: wrote {report.path} in {budget.elapsed():.1f} s; failed: {failed or 'none'}")
    return 1 if failed else 0


def summary(sections: dict[str, Any]) -> dict[str, Any]:
    """The headline figures, for docs/benchmarks.md."""
    s: dict[str, Any] = {}
    rows = sections.get("h2d", {}).get("rows", [])
    if rows and "pageable_gb_s" in rows[-1]:
        big = rows[-1]
        s["h2d"] = {
            k: big.get(k) for k in ("size_mb", "pageable_gb_s", "pinned_gb_s", "ceiling_gb_s")
        }
    nv = sections.get("decode", {}).get("nvjpeg", {})
    s["nvjpeg_img_s"] = {
        r["batch_size"]: r.get("decode_resize_img_s")
        for r in nv.get("rows", [])
        if "batch_size" in r
    }
    s["cpu_path_img_s"] = sections.get("decode", {}).get("cpu_path", {}).get("img_s")
    train = sections.get("train", {})
    s["wait_fraction"] = {
        k: train.get(k, {}).get("wait_fraction") for k in ("torch", "fastload", "fastload_nvjpeg")
    }
    s["img_s"] = {
        k: train.get(k, {}).get("img_s")
        for k in ("ceiling", "torch", "fastload", "fastload_nvjpeg")
    }
    s["statuses"] = {k: v.get("status") for k, v in sections.items()}
    return s


if __name__ == "__main__":
    sys.exit(main())
