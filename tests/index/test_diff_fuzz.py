"""A short run of the differential fuzzer (fuzz/diff_tarfile.py): fastload's scanner
against Python's tarfile, webdataset's grouping and the Python reference, on
generated and mutated archives of every format."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> object:
    spec = importlib.util.spec_from_file_location("diff_tarfile", ROOT / "fuzz" / "diff_tarfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["diff_tarfile"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [101, 202])
def test_differential_fuzz_short_run(seed: int, tmp_path: Path) -> None:
    diff = _load()
    rc, stats = diff.run(600, None, seed, tmp_path)  # type: ignore[attr-defined]
    assert rc == 0, sorted(tmp_path.iterdir())
    # the run really compared: archives accepted and grouped like webdataset, and
    # refusals of several kinds
    assert stats["accepted, same samples as webdataset"] > 100
    assert sum(v for k, v in stats.items() if k.startswith("refused")) > 100
    assert len({k.split(")")[0] for k in stats if k.startswith("refused")}) >= 5
