"""Content checksums: xxh3-128, written as ``"xxh3_128:<32 hex digits>"``.

The tag names the algorithm so that a manifest can say what it used; a checksum
with another tag is refused rather than compared wrongly.
"""

from __future__ import annotations

import os
from typing import TypeAlias

import xxhash

from fastload.errors import IntegrityError

#: Anything exposing the buffer protocol as bytes.
BytesLike: TypeAlias = "bytes | bytearray | memoryview"

__all__ = ["TAG", "BytesLike", "Xxh3Hasher", "check", "file_checksum", "xxh3_128"]

TAG = "xxh3_128"
_CHUNK = 8 * 2**20


def xxh3_128(data: BytesLike) -> str:
    """Return the tagged xxh3-128 checksum of ``data``."""
    return f"{TAG}:{xxhash.xxh3_128_hexdigest(data)}"


class Xxh3Hasher:
    """Incremental tagged xxh3-128: ``update(b)`` repeatedly, then ``hexdigest_tagged()``."""

    __slots__ = ("_h", "nbytes")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.nbytes = 0

    def update(self, data: BytesLike) -> None:
        """Feed more bytes."""
        self._h.update(data)
        self.nbytes += memoryview(data).nbytes

    def hexdigest_tagged(self) -> str:
        """Return ``"xxh3_128:<hex>"`` of everything fed so far."""
        return f"{TAG}:{self._h.hexdigest()}"


def file_checksum(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Return ``(size, tagged checksum)`` of a local file, read in chunks."""
    hasher = Xxh3Hasher()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            hasher.update(view[:n])
    return hasher.nbytes, hasher.hexdigest_tagged()


def check(what: str, expected_size: int, expected: str, actual_size: int, actual: str) -> None:
    """Raise :class:`IntegrityError` naming ``what`` unless size and checksum match."""
    if not expected.startswith(TAG + ":"):
        raise IntegrityError(f"{what}: unsupported checksum {expected!r} (expected {TAG}:…)")
    if actual_size != expected_size:
        raise IntegrityError(f"{what}: size is {actual_size} bytes, expected {expected_size}")
    if actual != expected:
        raise IntegrityError(f"{what}: checksum is {actual}, expected {expected}")
