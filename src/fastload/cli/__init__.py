"""The ``fastload`` command.

Each subcommand lives in its own module of this package with two functions:
``register(subparsers)`` adds its parser (and sets ``func``), and the function it
sets runs it and returns the exit status. Results go to stdout, progress to stderr.
Heavy imports happen inside the subcommand, never at start-up.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import select
import signal
import sys
import traceback
from collections.abc import Sequence

from fastload.cli.common import HelpFormatter, printable
from fastload.errors import FastloadError

# Subcommand modules, in the order ``fastload --help`` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "demo",
    "bench",
    "convert",
    "manifest",
    "index",
    "inspect",
    "cache",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    from fastload import __version__

    parser = argparse.ArgumentParser(
        prog="fastload",
        description="Fast, cached, resumable training data from object storage.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the traceback too (also accepted after the command)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"fastload.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status.

    Every failure ends in one line on stderr, ``fastload COMMAND: error: <object>:
    <cause>``, and exit status 1 (2 for a usage error, 130 for Ctrl-C); ``--debug``
    (anywhere on the line) adds the traceback. Output cut short by a closed stdout
    (``fastload inspect URL | head``) ends quietly with status 141, as a shell tool
    killed by SIGPIPE would.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = _take_debug(args_list)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    where = f"fastload {args.command}"
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        if _stdout_closed():
            return _quiet_exit()
        return _fail(where, sys.exc_info()[1], debug)
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return _fail(where, exc, debug)


def _take_debug(argv: list[str]) -> bool:
    """Remove ``--debug`` from ``argv`` (before a ``--``); return whether it was there."""
    end = argv.index("--") if "--" in argv else len(argv)
    found = "--debug" in argv[:end]
    argv[:end] = [a for a in argv[:end] if a != "--debug"]
    return found


def _fail(where: str, exc: BaseException | None, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    message = describe_error(exc) if exc is not None else "unknown error"
    if not debug and not isinstance(exc, FastloadError):
        message += " (run with --debug for the traceback)"
    with contextlib.suppress(BrokenPipeError, ValueError):  # stderr closed: nothing to tell
        print(printable(f"{where}: error: {message}"), file=sys.stderr)  # may quote data
    return 1


def _connection_failure(exc: BaseException) -> BaseException | None:
    """The transport failure behind ``exc``, if its cause chain holds one (fsspec's
    HTTP backend, for one, reports a refused connection as ``FileNotFoundError``)."""
    seen = 0
    cause = exc.__cause__ or exc.__context__
    while cause is not None and seen < 8:
        names = {c.__name__ for c in type(cause).__mro__}
        if isinstance(cause, (ConnectionError, TimeoutError)) or names & _CONNECTION_ERRORS:
            return cause
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


_CONNECTION_ERRORS = frozenset(
    {"ClientConnectorError", "ClientConnectionError", "EndpointConnectionError",
     "ConnectTimeoutError", "ServerDisconnectedError", "ConnectError"}
)  # fmt: skip


def describe_error(exc: BaseException) -> str:
    """One line naming the object and the cause of ``exc``, for the CLI's stderr."""
    from fastload.storage.retry import ObjectNotFoundError

    if isinstance(exc, ObjectNotFoundError):
        transport = _connection_failure(exc)
        if transport is not None:
            where = str(exc).split(": no such object", 1)[0]
            return f"{where}: cannot connect ({type(transport).__name__}: {transport})"
    if isinstance(exc, FastloadError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        target = exc.filename if exc.filename is not None else "fastload"
        text = f"{target}: {exc.strerror}"
        if exc.filename2 is not None:
            text += f" (and {exc.filename2})"
    elif isinstance(exc, ImportError):
        text = f"a required package is missing: {exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())  # one line, whatever the message held


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone away."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return True  # no usable stdout left: nothing to report on it either


def _quiet_exit() -> int:
    # Python flushes stdout again at exit and would print "Exception ignored ...
    # BrokenPipeError": point the descriptor at /dev/null first.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
