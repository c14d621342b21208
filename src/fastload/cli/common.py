"""Small pieces shared by the subcommands: progress bars, storage options, sizes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from fastload.errors import ConfigError

T = TypeVar("T")

__all__ = ["HelpFormatter", "add_storage_options", "parse_storage_options", "progress"]


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
    """Add ``--storage-options JSON`` to a subcommand's parser."""
    parser.add_argument(
        "--storage-options",
        default=None,
        metavar="JSON",
        help="fsspec/s3fs options as a JSON object (endpoint, credentials, region, ...)",
    )


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """Parse ``--storage-options``; raise :class:`ConfigError` on bad JSON."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--storage-options is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("--storage-options must be a JSON object")
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none (``None``) or the help
    text already says what an unset option means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "unset:" in text:
            return text
        return super()._get_help_string(action)
