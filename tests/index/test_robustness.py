"""Hostile input: truncated, random, mutated or absurd tars and corrupt indexes.

Every input must give either a valid table or a clean error, and the C++ core
must agree with the Python reference on which (and on the error's code and offset).
"""

from __future__ import annotations

import struct
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload import ShardFormatError, ShardIndex

from . import reference, tars
from .conftest import native_table, outcome, ref_table

SMALL = tars.make_tar(
    [
        ("d/", None),
        ("k0.jpg", b"J" * 600),
        ("k0.json", b"{}"),
        ("x" * 120 + "/k1.seg.png", b"P" * 10),  # PAX path
        ("k2.cls", b""),
    ],
    tarfile.PAX_FORMAT,
)
SMALL_GNU = tars.make_tar([("g" * 130 + ".txt", b"abc"), ("h.txt", b"d")], tarfile.GNU_FORMAT)


def agree(data: bytes) -> tuple[str, object]:
    got = outcome(native_table, data)
    assert got == outcome(ref_table, data)
    return got


@pytest.mark.parametrize("full", [SMALL, SMALL_GNU], ids=["pax", "gnu"])
def test_truncation_at_every_byte(full: bytes) -> None:
    complete, _ = native_table(full)
    ends = {off + (-size % 512) + size for _, off, size in complete}
    for cut in range(len(full) + 1):
        kind, result = agree(full[:cut])
        if kind == "ok":
            members: list[tuple[bytes, int, int]] = result[0]  # type: ignore[index]
            assert members == complete[: len(members)]
            # a shorter valid prefix ends on a block boundary after whole members
            # (past the end-of-archive block, trailing bytes are not read)
            if len(members) < len(complete):
                assert cut % 512 == 0
            assert all(off + size <= cut for _, off, size in members)
        else:
            code = result[0]  # type: ignore[index]
            assert code in (reference.TRUNCATED, reference.BAD_CHECKSUM)
    # a cut inside any member's data is an error, never a shorter member
    for _, off, size in complete:
        for cut in {off + 1, off + size - 1} if size > 1 else set():
            assert agree(full[:cut])[0] == "error"
    assert ends  # the archive did have members


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=3000))
def test_random_bytes(data: bytes) -> None:
    agree(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=512, max_size=512), st.binary(max_size=2000))
def test_random_headers_with_valid_checksum(header: bytes, rest: bytes) -> None:
    h = bytearray(header)
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}".encode() + b"\0 "
    agree(bytes(h) + rest)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([SMALL, SMALL_GNU]),
    st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=8),
    st.booleans(),
)
def test_mutated_tars(base: bytes, edits: list[tuple[int, int]], fix_checksums: bool) -> None:
    data = bytearray(base)
    for pos, value in edits:
        data[pos % len(data)] = value
    if fix_checksums:  # let mutations reach the parsers behind the checksum
        for start in range(0, len(data), 512):
            block = data[start : start + 512]
            if block[257:262] == b"ustar":
                block[148:156] = b" " * 8
                block[148:156] = f"{sum(block):06o}".encode() + b"\0 "
                data[start : start + 512] = block
    agree(bytes(data))


def test_corrupt_header_checksum() -> None:
    data = bytearray(SMALL)
    data[0] ^= 0x01  # the first header is a PAX 'x' header or the dir
    with pytest.raises(ShardFormatError, match="checksum mismatch") as e:
        ShardIndex.build(bytes(data), name="bad.tar")
    assert e.value.offset == 0


@pytest.mark.parametrize(
    ("size_field", "code"),
    [
        (tars.octal(0o77777777777, 12), reference.TRUNCATED),  # 8 GiB, past EOF
        (b"\x80" + b"\xff" * 11, reference.TOO_LARGE),  # base-256 beyond 64 bits
        (b"\x80" + b"\x00" * 3 + b"\xff" * 8, reference.TOO_LARGE),  # 2**64-1: padding overflows
        (b"\x80" + b"\x00" * 3 + b"\x7f" + b"\xff" * 7, reference.TRUNCATED),  # 2**63-1
        (b"\xff" * 12, reference.BAD_HEADER),  # negative base-256
        (b"12345678901\0", reference.BAD_HEADER),  # not octal
        (b"777777777777", reference.TRUNCATED),  # 12 digits, no terminator
    ],
)
def test_absurd_sizes(size_field: bytes, code: int) -> None:
    data = tars.raw_header(b"a.bin", size_field) + tars.padded(b"abc") + tars.end_blocks()
    kind, result = agree(data)
    assert kind == "error"
    assert result == (code, 0)
    with pytest.raises(ShardFormatError):
        ShardIndex.build(data)


@pytest.mark.parametrize(
    "records",
    [
        b"0 path=x\n",
        b"99 path=x.jpg\n",
        b"12 path=x.jpg\n",  # too short: the record ends before the newline
        b"x path=a.jpg\n",
        b"13 =abcdefgh\n",
        b"14 pathx.jpgxx\n",
        b"11 size=1a\n",
        b"30 size=999999999999999999999\n",
        b"18446744073709551616 path=a\n",
        b"12 path=a.jpg",  # no newline
    ],
)
def test_bad_pax_records(records: bytes) -> None:
    data = (
        tars.raw_member(b"P", records, b"x") + tars.raw_member(b"a.bin", b"x") + tars.end_blocks()
    )
    kind, result = agree(data)
    assert kind == "error", result
    with pytest.raises(ShardFormatError):
        ShardIndex.build(data)


def test_extended_header_at_end_is_an_error() -> None:
    data = tars.raw_member(b"P", tars.pax_record(b"path", b"a.jpg"), b"x") + tars.end_blocks()
    assert agree(data) == ("error", (reference.TRUNCATED, 0))


def test_huge_extended_header_refused() -> None:
    data = tars.raw_member(b"L", b"n" * (1 << 20 | 1), b"L") + tars.end_blocks()
    assert agree(data) == ("error", (reference.TOO_LARGE, 0))


# corrupt index sidecars -------------------------------------------------------


def good_index() -> bytes:
    return ShardIndex.build(SMALL).to_bytes()


def test_index_truncated_at_every_byte() -> None:
    idx = good_index()
    for cut in range(len(idx)):
        with pytest.raises(ShardFormatError):
            ShardIndex.from_bytes(idx[:cut], name="x.idx")
    assert len(ShardIndex.from_bytes(idx)) == 3


def _patch(idx: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(idx)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("magic", 0, "bad magic"),
        ("version", 2, "unsupported index version 2"),
        ("members", 1 << 60, "counts do not fit"),
        ("members", 3, "does not match its counts"),
        ("samples", 2**32, "counts do not fit"),
        ("total", 7, "header says the index is 7 bytes"),
        ("offset0", 1 << 40, "member 0 has a bad offset/size"),
        ("offset0", 513, "member 0 has a bad offset/size"),
        ("size0", 1 << 40, "member 0 has a bad offset/size"),
        ("nameoff1", 0, "name offset 1 is out of order"),
        ("nameoff1", 1 << 30, "name offset 1 is out of order or range"),
        ("first1", 5, "sample 1 has a bad member range"),
        ("count0", 0, "sample 0 has a bad member range"),
    ],
)
def test_corrupt_index_fields(field: str, value: int, message: str) -> None:
    idx = good_index()
    m = struct.unpack_from("<Q", idx, 24)[0]
    s = struct.unpack_from("<Q", idx, 32)[0]
    at = {
        "magic": (0, "<Q"),
        "version": (8, "<I"),
        "members": (24, "<Q"),
        "samples": (32, "<Q"),
        "total": (48, "<Q"),
        "offset0": (64, "<Q"),
        "size0": (64 + 8 * m, "<Q"),
        "nameoff1": (64 + 16 * m + 8, "<Q"),
        "first1": (64 + 24 * m + 8 + 8, "<Q"),
        "count0": (64 + 24 * m + 8 + 8 * s, "<I"),
    }[field]
    with pytest.raises(ShardFormatError, match=message) as e:
        ShardIndex.from_bytes(_patch(idx, at[0], at[1], value), name="shard.tar.idx")
    assert e.value.path == "shard.tar.idx"
    assert e.value.offset is not None


def test_index_member_sharing_no_key_is_refused() -> None:
    idx = bytearray(good_index())
    # make the second name of sample 0 ("k0.json") read "k9.json"
    pos = bytes(idx).index(b"k0.json")
    idx[pos + 1] = ord("9")
    with pytest.raises(ShardFormatError, match="does not share the key of sample 0"):
        ShardIndex.from_bytes(bytes(idx))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6))
def test_mutated_index_is_error_or_usable(edits: list[tuple[int, int]]) -> None:
    data = bytearray(good_index())
    for pos, value in edits:
        data[pos % len(data)] = value
    try:
        index = ShardIndex.from_bytes(bytes(data))
    except ShardFormatError:
        return
    # whatever validated must be fully usable and within the shard
    for i in range(len(index)):
        sample = index.sample(i)
        start, end = index.sample_range(i)
        assert 0 <= start <= end <= index.shard_size
        assert sample["__key__"] == index.key(i)
    assert np.all(index.offsets + index.sizes <= index.shard_size)
