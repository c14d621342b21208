"""The house's rules, checked over the import graph of ``src/fastload`` (issue 24).

Every ``import`` and ``from … import`` statement counts, at module level or inside a
function alike (a lazy import is still a dependency), and so does a string passed to
``importlib.import_module`` only where the root package resolves its public names (it
is not an edge here: the root package is the public face, above every layer).

- no module over 700 lines;
- no import cycle between modules;
- no module imports a private module of another subpackage (``fastload.<a>._x`` from
  outside ``<a>``);
- each subpackage imports only its own layer and the layers below it (the table below,
  the one in ``docs/design.md``);
- nothing in ``datasets`` imports ``convert`` (the old ``tests/convert/test_layers.py``
  check, folded in here; its run-time half stays there).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "fastload"
MAX_LINES = 700

# Layer of each subpackage (and root module); a module may import its own layer and
# lower ones only. Keep in step with docs/design.md's layer table.
LAYERS: dict[str, int] = {
    "errors": 0,
    "config": 0,
    "_args": 0,
    "_fs": 0,
    "packed": 0,
    "_native": 1,
    "storage": 2,
    "shards": 3,
    "cache": 4,
    "sampling": 5,
    "decode": 6,
    "datasets": 7,
    "text": 8,
    "loader": 9,
    "dali": 9,
    "convert": 10,
    "hf": 10,
    "bench": 11,
    "cli": 11,
    "__main__": 12,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement of a module, resolved to the
    most specific module of this package that it names, once each."""
    return sorted(set(_each_import(name, path)))


def _each_import(name: str, path: Path) -> Iterator[tuple[int, str]]:
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = base[: len(base) - node.level + 1]
                module = ".".join([*stem, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield node.lineno, sub if sub in MODULES else module


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {m for _, m in _imports(name, path) if m in MODULES and m != name}
    return graph


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_module_is_over_the_size_limit() -> None:
    big = {
        str(p.relative_to(SRC)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_there_is_no_import_cycle() -> None:
    graph = _graph()
    # the root package re-exports lazily (importlib on first access), so it is no
    # part of any cycle; a module importing ``fastload`` for a public name is fine
    graph.pop("fastload", None)
    for deps in graph.values():
        deps.discard("fastload")
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_packages_private_module() -> None:
    bad = []
    for name, path in MODULES.items():
        for line, module in _imports(name, path):
            parts = module.split(".")
            if parts[0] != "fastload" or len(parts) < 3:
                continue
            private = any(p.startswith("_") and not p.startswith("__") for p in parts[2:])
            if private and parts[1] != _top(name):
                bad.append(f"{path.relative_to(SRC)}:{line}: {module}")
    assert not bad, "private modules of another subpackage imported:\n" + "\n".join(bad)


def test_layers_import_only_downward() -> None:
    unknown = {_top(n) for n in MODULES if _top(n) and _top(n) not in LAYERS}
    assert not unknown, f"subpackages with no layer in this test's table: {unknown}"
    bad = []
    for name, path in MODULES.items():
        here = _top(name)
        if not here:
            continue
        for line, module in _imports(name, path):
            there = _top(module) if module.startswith("fastload.") else None
            if there and there in LAYERS and LAYERS[there] > LAYERS[here]:
                bad.append(f"{path.relative_to(SRC)}:{line}: {module} ({here} -> {there})")
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


# pairs of subpackages that must not import each other's modules whatever their layers
# say: the datasets never need a converter, and the converters never load a dataset
# (tests/convert/test_layers.py keeps the run-time half: converting loads no dataset)
APART = [("datasets", "convert"), ("convert", "datasets")]


@pytest.mark.parametrize(("package", "other"), APART)
def test_packages_kept_apart_do_not_import_each_other(package: str, other: str) -> None:
    bad = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for name, path in MODULES.items()
        if _top(name) == package
        for line, module in _imports(name, path)
        if module == f"fastload.{other}" or module.startswith(f"fastload.{other}.")
    ]
    assert not bad, bad


def test_the_checks_see_the_graph() -> None:
    # guards against a checker that reads nothing: the graph has the edges we know of
    graph = _graph()
    assert len(MODULES) > 80
    assert "fastload.errors" in graph["fastload.config"] or any(
        "fastload.errors" in deps for deps in graph.values()
    )
    assert sum(len(d) for d in graph.values()) > 200
