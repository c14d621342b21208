"""Fixtures and helpers shared by the index tests."""

from __future__ import annotations

import io
import tarfile

import pytest

from fastload import _native

from . import reference
from .reference import RefError, RefTable

Table = tuple[list[tuple[bytes, int, int]], list[tuple[int, int]]]


def native_table(data: bytes) -> Table:
    """The C++ scan of ``data`` as (members, samples) lists."""
    r = _native.scan(data)
    names, bounds = r["names"], r["name_offsets"].tolist()
    members = [
        (names[a:b], off, size)
        for a, b, off, size in zip(
            bounds[:-1], bounds[1:], r["offsets"].tolist(), r["sizes"].tolist(), strict=True
        )
    ]
    samples = list(zip(r["sample_first"].tolist(), r["sample_count"].tolist(), strict=True))
    assert r["shard_size"] == len(data)
    return members, samples


def ref_table(data: bytes) -> Table:
    """The reference scan of ``data`` as (members, samples) lists."""
    t: RefTable = reference.scan(data)
    return t.members, t.samples


def outcome(fn: object, data: bytes) -> tuple[str, object]:
    """("ok", table) or ("error", (code, offset)) for a scanner."""
    try:
        return "ok", fn(data)  # type: ignore[operator]
    except _native.FormatError as exc:
        return "error", (exc.args[2], exc.args[1])
    except RefError as exc:
        return "error", (exc.code, exc.offset)


def tarfile_members(data: bytes) -> list[tuple[bytes, int, int]]:
    """Indexed members according to Python's tarfile (regular files with a key)."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            name = m.name.encode("utf-8", "surrogateescape")
            if m.isreg() and reference.key_length(name) is not None:
                out.append((name, m.offset_data, m.size))
    return out


@pytest.fixture
def small_tar() -> bytes:
    """Three samples, two fields each, PAX format."""
    from .tars import samples_tar

    return samples_tar(
        [
            ("k0", [("jpg", b"J" * 700), ("json", b'{"a": 0}')]),
            ("dir/k1", [("jpg", b""), ("json", b"{}")]),
            ("k2", [("seg.png", b"P" * 1024), ("cls", b"7")]),
        ]
    )
