"""The ``fastload`` command.

Each subcommand lives in its own module of this package with two functions:
``register(subparsers)`` adds its parser (and sets ``func``), and the function it
sets runs it and returns the exit status. Results go to stdout, progress to stderr.
Heavy imports happen inside the subcommand, never at start-up.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fastload.cli.common import HelpFormatter
from fastload.errors import FastloadError

# Subcommand modules, in the order ``fastload --help`` lists them.
SUBCOMMANDS: tuple[str, ...] = ("demo", "bench", "convert", "index", "inspect", "cache")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    from fastload import __version__

    parser = argparse.ArgumentParser(
        prog="fastload",
        description="Fast, cached, resumable training data from object storage.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"fastload.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except FastloadError as exc:
        print(f"fastload {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
