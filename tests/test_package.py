"""``import fastload`` and the core work with only the core dependencies installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import fastload

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "nvidia", "s3fs", "PIL", "pycocotools",
                                  "matplotlib", "botocore", "aiobotocore"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def test_core_works_without_optional_dependencies(tmp_path: Path) -> None:
    r = _run(
        """
        import fastload
        from fastload.errors import MissingDependencyError
        with fastload.ShardWriter("ds", shard_size="1KB") as w:
            for i in range(5):
                w.write({"__key__": f"k{i}", "bin": bytes([i]) * 700})
        m = fastload.Manifest.from_json(open("ds/manifest.json").read(), "ds")
        idx = fastload.ShardIndex.load("ds/" + m.shards[0].index_name)
        with fastload.ShardReader("ds/" + m.shards[0].name, idx) as r:
            assert bytes(r[0]["bin"]) == bytes([0]) * 700
        assert fastload.World.detect().world_size == 1
        assert fastload.parse_size("64MB") == 64_000_000
        try:
            fastload.StreamingDataset
        except MissingDependencyError as exc:
            print("missing:", exc)
        for mod in ("torch", "nvidia", "s3fs", "PIL"):
            assert mod not in sys.modules, mod
        from fastload.cli import main
        assert main(["inspect", "ds"]) == 0
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "missing: fastload.StreamingDataset needs the 'torch' package" in r.stdout
    assert "fastload[torch]" in r.stdout
    assert "samples  5" in r.stdout


def test_public_names_resolve() -> None:
    for name in fastload.__all__:
        assert getattr(fastload, name) is not None, name
    assert fastload.__all__ == sorted(fastload.__all__)


def test_every_error_class_is_public() -> None:
    import importlib
    import inspect

    import fastload
    import fastload.errors

    missing = []
    for name in _module_names():
        if name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency absent here (DALI, CUDA bits)
            continue
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, fastload.errors.FastloadError)
                and obj.__module__.startswith("fastload")
                and getattr(fastload.errors, obj.__name__, None) is not obj
                and getattr(fastload, obj.__name__, None) is not obj
            ):
                missing.append(f"{obj.__module__}.{obj.__name__} (seen as {name}.{attr})")
    assert not missing, "error classes not importable from fastload/fastload.errors:\n" + (
        "\n".join(sorted(set(missing)))
    )
    assert set(fastload.errors.__all__) <= set(fastload.__all__)


def _module_names() -> list[str]:
    src = Path(__file__).resolve().parents[1] / "src"
    names = []
    for path in sorted((src / "fastload").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names
