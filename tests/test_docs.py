"""The documentation stays true to the code.

* every relative link in ``README.md`` and ``docs/**/*.md`` points to an existing file,
  and every ``#anchor`` to an existing heading;
* absolute ``http(s)://`` URLs name only local or example hosts (never a registry);
* ``docs/cli.md`` equals what ``docs/gen_cli.py`` renders from the real parsers, and
  documents every subcommand;
* every ``fastload ...`` command line shown in a shell block parses with the real CLI;
* every ``fastload.Name`` (or ``fastload.module.Name``) mentioned resolves;
* every Python block compiles, and blocks marked ``<!-- docs-test: run -->`` (the line
  right before the fence) run, page by page in one namespace, in a fresh temporary
  directory, leaving no threads behind.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
RUN_MARKER = "<!-- docs-test: run -->"

_FENCE_RE = re.compile(r"^(\s*)(```|~~~)(.*)$")
_LINK_RE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE_RE = re.compile(r"`+[^`]*`+")
_URL_RE = re.compile(r"https?://([^\s/:)\]\"'`,]+)", re.IGNORECASE)
_NAME_RE = re.compile(r"(?<![\w/.-])fastload((?:\.[A-Za-z_]\w*)+)")
_ALLOWED_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0")
_ALLOWED_SUFFIXES = (".example", ".myqcloud.com")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _gen_cli() -> types.ModuleType:
    return _doc_script("gen_cli")


def _doc_script(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"fastload_docs_{name}", DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Block:
    """A fenced code block: its info string, its text, where it starts, and whether
    the line before it is the run marker."""

    def __init__(self, info: str, text: str, line: int, run: bool) -> None:
        self.info = info.strip().lower()
        self.text = text
        self.line = line
        self.run = run

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info else ""


def split_page(text: str) -> tuple[list[str], list[Block]]:
    """The page's prose lines (code blocks blanked out, line numbers kept) and blocks."""
    prose: list[str] = []
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3), i
        run = i > 0 and lines[i - 1].strip() == RUN_MARKER
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append(Block(info, "\n".join(body) + "\n", start + 1, run))
        prose.extend([""] * (len(body) + 2))
        i += 1
    return prose, blocks


def slug(title: str) -> str:
    """GitHub's heading anchor: inline markup dropped, lower case, punctuation other
    than ``-`` and ``_`` removed, spaces to ``-``."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # links keep their text
    title = title.replace("`", "").replace("*", "")
    return "".join(
        ch if (ch.isalnum() or ch in "-_") else "-" if ch == " " else ""
        for ch in title.strip().lower()
    )


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page`` (duplicates numbered as GitHub does)."""
    prose, _ = split_page(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose:
        m = _HEADING_RE.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> Iterator[tuple[int, str]]:
    """``(line number, target)`` of every Markdown link outside code."""
    prose, _ = split_page(page.read_text(encoding="utf-8"))
    for no, line in enumerate(prose, 1):
        for m in _LINK_RE.finditer(_INLINE_CODE_RE.sub("", line)):
            yield no, m.group(1)


# ---------------------------------------------------------------------------- links
def test_pages_found() -> None:
    names = {_rel(p) for p in PAGES}
    for required in (
        "README.md",
        "docs/getting-started.md",
        "docs/concepts.md",
        "docs/howto.md",
        "docs/cli.md",
        "docs/tuning.md",
        "docs/design.md",
    ):
        assert required in names, f"{required} is missing"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path) -> None:
    bad: list[str] = []
    for no, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # absolute URL: checked by test_absolute_urls_are_local
        path_part, _, fragment = target.partition("#")
        dest = page if not path_part else (page.parent / path_part).resolve()
        if not dest.exists():
            bad.append(f"{_rel(page)}:{no}: link to missing file {target!r}")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{_rel(page)}:{no}: no heading for anchor {target!r} in {dest.name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_absolute_urls_are_local(page: Path) -> None:
    bad = []
    for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in _URL_RE.finditer(line):
            host = m.group(1).lower().rstrip(">.")
            if host in _ALLOWED_HOSTS or host.endswith(_ALLOWED_SUFFIXES):
                continue
            bad.append(f"{_rel(page)}:{no}: absolute URL to {host!r}; link relatively")
    assert not bad, "\n".join(bad)


def test_slug_matches_the_cli_generator() -> None:
    gen = _gen_cli()
    for title in ("fastload cache stats", "fastload convert cityscapes", "fastload"):
        assert gen.anchor(title) == slug(f"`{title}`") == slug(title)


# ------------------------------------------------------------------------------ CLI
def test_cli_reference_is_current() -> None:
    expected = _gen_cli().render()
    current = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/cli.md is out of date with the parsers: run `.venv/bin/python docs/gen_cli.py`"
    )


def test_cli_reference_documents_every_subcommand() -> None:
    from fastload.cli import SUBCOMMANDS

    headings = anchors(DOCS / "cli.md")
    for name in SUBCOMMANDS:
        assert f"fastload-{name}" in headings, f"fastload {name} is not in docs/cli.md"
    assert "fastload-cache-warm" in headings
    assert "fastload-convert-cityscapes" in headings


def _command_lines(text: str) -> Iterator[str]:
    """Logical lines of a shell block (``\\`` continuations joined, prompts removed)."""
    joined = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        yield joined.strip().removeprefix("$ ").strip()
        joined = ""
    if joined.strip():
        yield joined.strip()


def _shown_commands() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        _, blocks = split_page(page.read_text(encoding="utf-8"))
        for block in blocks:
            if block.language not in ("bash", "sh", "shell", "console"):
                continue
            for line in _command_lines(block.text):
                words = shlex.split(line, comments=True)
                while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words[:1] == ["fastload"]:
                    out.append((f"{_rel(page)}:{block.line}", shlex.join(words)))
    return out


SHOWN_COMMANDS = _shown_commands()


def test_docs_show_commands() -> None:
    shown = {shlex.split(line, comments=True)[1] for _, line in SHOWN_COMMANDS}
    from fastload.cli import SUBCOMMANDS

    assert shown >= set(SUBCOMMANDS), f"no example of {set(SUBCOMMANDS) - shown}"


@pytest.mark.parametrize(("where", "line"), SHOWN_COMMANDS, ids=[w for w, _ in SHOWN_COMMANDS])
def test_shown_command_parses(where: str, line: str) -> None:
    from fastload.cli import build_parser

    words = shlex.split(line, comments=True)[1:]
    err = io.StringIO()
    code: Any = None
    args = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = build_parser().parse_args(words)
        except SystemExit as exc:  # argparse's way of refusing (or of --help)
            code = exc.code
    assert code in (None, 0), f"{where}: `{line}` does not parse: {err.getvalue().strip()}"
    if code is None:
        assert getattr(args, "func", None) is not None, f"{where}: `{line}` names no command"


# ------------------------------------------------------------------------ API names
def resolve(dotted: str) -> Any:
    """Import or look up ``fastload.a.b.c``; raise AttributeError naming what is missing."""
    obj: Any = importlib.import_module("fastload")
    name = "fastload"
    for part in dotted.split(".")[1:]:
        name += "." + part
        if isinstance(obj, types.ModuleType):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            if spec is not None:
                obj = importlib.import_module(name)
                continue
        if not hasattr(obj, part):
            raise AttributeError(f"{name} does not exist")
        obj = getattr(obj, part)
    return obj


def _mentioned_names() -> dict[str, str]:
    found: dict[str, str] = {}
    for page in PAGES:
        for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in _NAME_RE.finditer(line):
                found.setdefault("fastload" + m.group(1), f"{_rel(page)}:{no}")
    return found


def test_public_names_in_docs_exist() -> None:
    import fastload

    names = _mentioned_names()
    assert "fastload.DataLoader" in names
    assert "fastload.StreamingDataset" in names
    bad = []
    for dotted, where in sorted(names.items()):
        first = dotted.split(".")[1]
        is_module = importlib.util.find_spec(f"fastload.{first}") is not None
        if not is_module and not hasattr(fastload, first):
            bad.append(f"{where}: fastload.{first} is not an attribute of the package")
            continue
        try:
            resolve(dotted)
        except (AttributeError, ImportError) as exc:
            bad.append(f"{where}: {dotted}: {exc}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ runnable blocks
# pages whose ``python`` blocks are Python (the others may show pseudo-code)
COMPILED = [
    p
    for p in PAGES
    if (p.parent == DOCS and p.name not in ("loader-sync.md", "benchmarks.md"))
    or p.name == "README.md"
]


def test_python_blocks_compile() -> None:
    bad = []
    for page in COMPILED:
        for block in split_page(page.read_text(encoding="utf-8"))[1]:
            if block.language != "python":
                continue
            try:
                compile(block.text, f"{_rel(page)}:{block.line}", "exec")
            except SyntaxError as exc:
                bad.append(f"{_rel(page)}:{block.line}: {exc}")
    assert not bad, "\n".join(bad)


RUNNABLE = [
    page for page in PAGES if any(b.run for b in split_page(page.read_text(encoding="utf-8"))[1])
]


def test_some_blocks_are_runnable() -> None:
    assert DOCS / "getting-started.md" in RUNNABLE


def _fastload_objects(namespace: dict[str, Any]) -> Iterator[Any]:
    """fastload objects a page left in its namespace, also inside lists and loaders."""
    stack = list(namespace.values())
    seen: set[int] = set()
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif type(value).__module__.startswith("fastload"):
            yield value
            inner = getattr(value, "dataset", None)
            if inner is not None:
                stack.append(inner)


@pytest.mark.parametrize("page", RUNNABLE, ids=_rel)
def test_marked_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm import tqdm

    from support.leaks import leaked_threads

    tqdm(disable=True).close()  # tqdm's one monitor thread per process is not a leak
    before = set(threading.enumerate())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FASTLOAD_CACHE_DIR", raising=False)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    _, blocks = split_page(page.read_text(encoding="utf-8"))
    marked = [b for b in blocks if b.run]
    assert all(b.language == "python" for b in marked), "only python blocks can be run"
    try:
        for block in marked:
            code = compile(block.text, f"{_rel(page)}:{block.line}", "exec")
            exec(code, namespace)
    finally:
        for obj in _fastload_objects(namespace):
            close = getattr(obj, "close", None)
            if callable(close):
                close()
        namespace.clear()
    leaked = leaked_threads(before)
    assert not leaked, f"{_rel(page)}: its examples leave threads running: {leaked}"


# ------------------------------------------------------------------------------ API
def _gen_api() -> types.ModuleType:
    return _doc_script("gen_api")


def test_api_reference_is_current() -> None:
    pages = _gen_api().render()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md")}
    assert on_disk == pages, "docs/api/ is out of date: run `.venv/bin/python docs/gen_api.py`"


def test_api_reference_lists_every_public_name() -> None:
    import fastload

    text = "\n".join(_gen_api().render().values())
    for name in fastload.__all__:
        if name in {"__version__", "convert", "dali"} or name in fastload.errors.__all__:
            continue
        assert re.search(rf"^::: fastload\.[\w.]*\b{name}$", text, re.M), name
    assert "::: fastload.errors" in text


# ------------------------------------------------------------------------- arguments
def test_argument_table_is_current() -> None:
    text = _doc_script("gen_args").render()
    on_disk = (DOCS / "arguments.md").read_text(encoding="utf-8")
    assert on_disk == text, (
        "docs/arguments.md is out of date: run `.venv/bin/python docs/gen_args.py`"
    )


def test_argument_table_covers_every_dataset_loader_and_converter() -> None:
    import fastload
    import fastload.convert

    titles = [t for t, _ in _doc_script("gen_args").columns()]
    datasets = [n for n in fastload.__all__ if n.endswith("Dataset")]
    assert datasets
    assert set(datasets) <= set(titles)  # found wherever they are defined
    expected = {"CocoDetection", "Cityscapes", "ImageFolder", "DataLoader", "cached"}
    converters = {
        f"convert.{n}"
        for n in fastload.convert.__all__
        if inspect.isfunction(getattr(fastload.convert, n))
    }
    assert expected | converters | {"dali.pipeline"} <= set(titles)
    assert len(titles) == len(set(titles))
