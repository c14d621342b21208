"""The text datasets' old import paths still work for one release, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fastload
import fastload.text

MOVED = {
    "fastload.datasets.tokens": ["TokenDataset", "TokenLayout", "TokenSource", "collate_packed"],
    "fastload.datasets.parquet": [
        "ParquetDataset",
        "ParquetFile",
        "ParquetTokenDataset",
        "scan_parquet",
    ],
}


@pytest.mark.parametrize(("old", "names"), sorted(MOVED.items()))
def test_the_old_path_gives_the_same_object_with_a_deprecation_warning(
    old: str, names: list[str]
) -> None:
    module = importlib.import_module(old)
    for name in names:
        with pytest.warns(DeprecationWarning, match=rf"from fastload\.text import {name}"):
            value = getattr(module, name)
        assert value is getattr(fastload.text, name)
    with pytest.raises(AttributeError):
        module.NoSuchName  # noqa: B018


def test_from_import_of_an_old_path_warns_at_the_callers_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from fastload.datasets.tokens import TokenDataset
    assert TokenDataset is fastload.TokenDataset
    assert [w.category for w in caught] == [DeprecationWarning]
    assert caught[0].filename == __file__


def test_the_root_package_and_convert_point_to_the_new_modules() -> None:
    assert fastload.TokenDataset.__module__ == "fastload.text.tokens"
    assert fastload.ParquetDataset.__module__ == "fastload.text.parquet"
    assert fastload.ParquetTokenDataset.__module__ == "fastload.text.parquet_tokens"
    assert fastload.convert.text is fastload.text.text
    assert fastload.convert.TextConvertReport is fastload.text.TextConvertReport


def test_importing_the_old_modules_imports_nothing_of_text() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        "import sys\n"
        "import fastload.datasets.tokens, fastload.datasets.parquet\n"
        "bad = [m for m in sys.modules if m.startswith(('fastload.text', 'fastload.convert'))]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
