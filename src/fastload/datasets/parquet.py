"""Deprecated: the parquet datasets moved to :mod:`fastload.text` (``fastload.text.parquet``).

Importing a name from here still works for one release, with a
:class:`DeprecationWarning` naming the new path. The names resolve lazily (PEP 562):
``datasets`` sits below ``text`` and imports nothing of it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["ParquetDataset", "ParquetFile", "ParquetTokenDataset", "scan_parquet"]  # noqa: F822 (resolved by __getattr__)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to fastload.text; write `from fastload.text import {name}` "
        f"(the old path stops working in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("fastload.text"), name)


def __dir__() -> list[str]:
    return list(__all__)
