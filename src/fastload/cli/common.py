"""Small pieces shared by the subcommands: progress bars, storage options, sizes, the
``--json`` ending, and the escaping of untrusted text (manifest strings, member names)
printed to a terminal."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from fastload.config import env
from fastload.errors import ConfigError
from fastload.storage.url import credential_values

T = TypeVar("T")

__all__ = [
    "INTERRUPTED",
    "STORAGE_OPTIONS_ENV",
    "DemoStore",
    "HelpFormatter",
    "add_json_option",
    "add_storage_options",
    "parse_storage_options",
    "print_result",
    "printable",
    "printable_tree",
    "progress",
    "say",
    "sigterm_as_interrupt",
    "start_clock",
    "start_local_s3",
]

#: The environment variable holding storage options (JSON, or ``@FILE``) when
#: ``--storage-options`` is not given.
STORAGE_OPTIONS_ENV = "FASTLOAD_STORAGE_OPTIONS"
# C0 controls but newline, DEL, C1 controls, and the bidirectional overrides and
# isolates ("Trojan Source"): a terminal acts on them instead of showing them.
_CONTROL_RE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def progress(
    items: Iterable[T],
    desc: str,
    unit: str = "it",
    total: int | None = None,
    disable: bool | None = None,
) -> Iterator[T]:
    """Wrap ``items`` in a tqdm progress bar on stderr (off when stderr is not a terminal
    unless ``disable=False``)."""
    from tqdm import tqdm

    if disable is None:
        disable = not sys.stderr.isatty()
    yield from tqdm(items, desc=desc, unit=unit, total=total, file=sys.stderr, disable=disable)


def add_storage_options(parser: Any) -> None:
    """Add ``--storage-options JSON|@FILE`` to a subcommand's parser."""
    parser.add_argument(
        "--storage-options",
        default=None,
        metavar="JSON|@FILE",
        help="fsspec/s3fs options as a JSON object (endpoint, region, ...), or @FILE to read "
        "it from a file; unset: $FASTLOAD_STORAGE_OPTIONS (JSON or @FILE). Credentials "
        "belong in the file or the environment: a command line is visible to every local "
        "user (ps)",
    )


def add_json_option(parser: Any) -> None:
    """Add ``--json`` (see :func:`print_result`) to a subcommand's parser."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def print_result(
    args: argparse.Namespace,
    doc: Mapping[str, Any],
    lines: Iterable[str],
    *,
    sort_keys: bool = False,
) -> None:
    """How a subcommand ends on stdout: with ``--json``, ``doc`` as one JSON document
    (``"version": 1`` first); else the summary ``lines``, one a line (a generator is
    not consumed with ``--json``)."""
    if args.json:
        print(json.dumps({"version": 1, **doc}, indent=1, sort_keys=sort_keys))
    else:
        for line in lines:
            print(line)


def _read_options_file(path: str, what: str) -> str:
    path = os.path.expanduser(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(1 << 20)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        print(
            f"fastload: warning: {path} (storage options) is readable or writable by other "
            f"users (mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`",
            file=sys.stderr,
        )
    return data.decode("utf-8", "replace")


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """Parse ``--storage-options`` (JSON, or ``@FILE`` holding JSON); when it is not
    given, ``$FASTLOAD_STORAGE_OPTIONS`` (read through :func:`fastload.config.env`),
    same forms. Returns None when neither is set. Warns on stderr when a credential
    arrives as inline JSON on the command line (visible to every local user) or in a
    file others may read. Raises :class:`ConfigError` on bad JSON or an unreadable
    file; the message never echoes the text (it may hold secrets)."""
    what = "--storage-options"
    on_argv = True
    if not text:
        text = env(STORAGE_OPTIONS_ENV)
        what, on_argv = f"${STORAGE_OPTIONS_ENV}", False
        if not text:
            return None
    if text.startswith("@"):
        text = _read_options_file(text[1:], what)
        on_argv = False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = (
            f" at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise ConfigError(f"{what} is not valid JSON{where}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object")
    if on_argv and credential_values(value):
        print(
            "fastload: warning: --storage-options on the command line holds a credential, "
            "which every local user can read (ps, /proc/<pid>/cmdline); use --storage-options "
            f"@FILE (mode 600) or ${STORAGE_OPTIONS_ENV}",
            file=sys.stderr,
        )
    return value


def printable(text: object) -> str:
    """``str(text)`` with terminal control characters (escape sequences, carriage
    returns, bidirectional overrides) shown as ``\\xNN``/``\\uNNNN``: for printing
    strings from a manifest, a shard or a catalog, which anyone may have written."""
    return _CONTROL_RE.sub(lambda m: _escape(m.group()), str(text))


def printable_tree(value: Any) -> Any:
    """``value`` (a decoded JSON document) with :func:`printable` applied to every
    string in it, keys included; numbers and the structure unchanged."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none (``None``) or the help
    text already says what an unset option means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "unset:" in text:
            return text
        return super()._get_help_string(action)


# ------------------------------------------------------------ the demos' helpers
# (``fastload demo`` and ``fastload demo --text`` share these)
_T0 = [time.perf_counter()]
# Set by the signal handlers. The KeyboardInterrupt they raise can be swallowed when
# it lands in a finalizer (``__del__`` of an s3fs/aiohttp object): every phase
# boundary checks the flag too, so an interrupt always stops the demo.
INTERRUPTED = [False]


def start_clock() -> float:
    """Start the demo's clock (what :func:`say` prints seconds since); returns it."""
    _T0[0] = time.perf_counter()
    return _T0[0]


def say(text: str) -> None:
    """Print a demo progress line (seconds since :func:`start_clock`); raises
    KeyboardInterrupt if a signal asked the demo to stop."""
    if INTERRUPTED[0]:
        raise KeyboardInterrupt
    print(f"demo [{time.perf_counter() - _T0[0]:5.1f} s]: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM (and SIGINT) into KeyboardInterrupt so the cleanup below runs for
    it too, and remember it (see ``INTERRUPTED``)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        INTERRUPTED[0] = True
        raise KeyboardInterrupt

    INTERRUPTED[0] = False
    try:
        previous = [signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)]
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def start_local_s3(root: Path) -> Any:
    """A started :class:`LocalS3` under ``root``, or None (saying so) without ``weed``."""
    from fastload.bench.local_s3 import LocalS3, find_weed
    from fastload.errors import MissingDependencyError

    try:
        find_weed()
    except MissingDependencyError as exc:
        say(f"SeaweedFS not available ({exc}); falling back to a file:// store")
        return None
    return LocalS3(root / "s3").start()


class DemoStore:
    """Where a demo works: ``keep`` (a directory kept afterwards), else a temporary one,
    and the store it serves its dataset from (:meth:`open`). Leaving the ``with``
    block stops the server and removes the temporary directory, also on errors."""

    def __init__(self, keep: str | None) -> None:
        self.keep = keep
        self.root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="fastload-demo-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.server: Any = None

    def open(self, name: str, file_store: bool) -> tuple[dict[str, Any] | None, str]:
        """Start the local S3 store (a file:// store under the root with ``file_store``
        or without SeaweedFS); returns its storage options and the base URL of ``name``."""
        self.server = None if file_store else start_local_s3(self.root)
        if self.server is None:
            base = (self.root / "store" / name).as_uri()
            say(f"using a file:// store at {base} (no S3 in between)")
            return None, base
        self.server.create_bucket("demo")
        say(f"local S3 store (SeaweedFS) at {self.server.endpoint_url}")
        return self.server.storage_options, f"s3://demo/{name}"

    @property
    def kind(self) -> str:
        """``"seaweedfs"``, or ``"file"`` when :meth:`open` fell back to a file:// store."""
        return "file" if self.server is None else "seaweedfs"

    def __enter__(self) -> DemoStore:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop(remove=False, grace_s=1.0)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
