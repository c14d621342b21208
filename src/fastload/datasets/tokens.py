"""Deprecated: the token datasets moved to :mod:`fastload.text` (``fastload.text.tokens``).

Importing a name from here still works for one release, with a
:class:`DeprecationWarning` naming the new path. The names resolve lazily (PEP 562):
``datasets`` sits below ``text`` and imports nothing of it.
"""

from __future__ import annotations

from fastload._args import moved_names

__all__ = ["TokenDataset", "TokenLayout", "TokenSource", "collate_packed"]  # noqa: F822 (resolved by __getattr__)

__getattr__, __dir__ = moved_names(__name__, __all__, "fastload.text")
