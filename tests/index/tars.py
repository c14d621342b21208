"""Synthetic tar archives for the index tests: valid ones via tarfile, odd ones by hand."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Sequence

BLOCK = 512


def make_tar(
    entries: Iterable[tuple[str, bytes | None]],
    fmt: int = tarfile.PAX_FORMAT,
) -> bytes:
    """A tar of ``(name, data)`` entries in order; ``data=None`` makes a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def samples_tar(
    samples: Sequence[tuple[str, Sequence[tuple[str, bytes]]]],
    fmt: int = tarfile.PAX_FORMAT,
) -> bytes:
    """A WebDataset tar: ``[(key, [(field, data), ...]), ...]``."""
    return make_tar(
        ((f"{key}.{fld}", data) for key, fields in samples for fld, data in fields), fmt
    )


def octal(value: int, width: int) -> bytes:
    """A NUL-terminated octal header field."""
    return f"{value:0{width - 1}o}".encode() + b"\0"


def raw_header(
    name: bytes,
    size: int | bytes = 0,
    typeflag: bytes = b"0",
    *,
    prefix: bytes = b"",
    magic: bytes = b"ustar\x0000",
    linkname: bytes = b"",
    fix_checksum: bool = True,
) -> bytes:
    """One 512-byte header; ``size`` may be raw field bytes (e.g. base-256)."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name[:100]
    h[100:108] = octal(0o644, 8)
    h[108:116] = octal(0, 8)
    h[116:124] = octal(0, 8)
    h[124:136] = size if isinstance(size, bytes) else octal(size, 12)
    h[136:148] = octal(1_700_000_000, 12)
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[157 : 157 + len(linkname)] = linkname
    h[257:265] = magic
    h[345 : 345 + len(prefix)] = prefix
    if fix_checksum:
        h[148:156] = f"{sum(h):06o}".encode() + b"\0 "
    return bytes(h)


def padded(data: bytes) -> bytes:
    """Data padded to whole blocks."""
    return data + b"\0" * (-len(data) % BLOCK)


def raw_member(name: bytes, data: bytes, typeflag: bytes = b"0", **kw: object) -> bytes:
    """Header plus padded data."""
    return raw_header(name, len(data), typeflag, **kw) + padded(data)  # type: ignore[arg-type]


def end_blocks() -> bytes:
    """The two zero blocks that end an archive."""
    return b"\0" * (2 * BLOCK)


def pax_record(key: bytes, value: bytes) -> bytes:
    """One PAX record with its self-inclusive length."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body
