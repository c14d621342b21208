"""The C++ scanner against the Python reference and tarfile, on generated archives."""

from __future__ import annotations

import tarfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastload import ShardFormatError, ShardIndex, _native

from . import tars
from .conftest import native_table, outcome, ref_table, tarfile_members

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}

hex_keys = st.text(alphabet="0123456789abcdef", min_size=1, max_size=40)
dir_keys = st.builds(
    lambda d, n: f"{d}/{n:04d}",
    st.sampled_from(["dir", "a/b", "v1.0", "x" * 120, "deep/" + "y" * 150]),
    st.integers(0, 9999),
)
long_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=90, max_size=260)
unicode_keys = st.text(alphabet="abcé日本ключ", min_size=1, max_size=12)
keys = st.one_of(hex_keys, dir_keys, long_keys, unicode_keys)
fields = st.lists(
    st.sampled_from(["jpg", "json", "seg.png", "cls", "txt", "zzz", "aaa", "a.b.c"]),
    min_size=1,
    max_size=4,
    unique=True,
)
payload = st.one_of(st.just(b""), st.binary(max_size=1100))
sample_lists = st.lists(
    st.tuples(
        keys, fields.flatmap(lambda fs: st.tuples(*(st.tuples(st.just(f), payload) for f in fs)))
    ),
    max_size=8,
    unique_by=lambda s: s[0],
)


def build(samples: list, fmt: int, dirs: list[bool]) -> bytes:
    entries: list[tuple[str, bytes | None]] = []
    for i, (key, flds) in enumerate(samples):
        if i < len(dirs) and dirs[i]:
            entries.append((f"d{i}/", None))
        entries.extend((f"{key}.{f}", data) for f, data in flds)
    try:
        return tars.make_tar(entries, fmt)
    except ValueError:  # USTAR cannot hold some long names
        assume(False)
        raise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_lists, st.sampled_from(list(FORMATS.values())), st.lists(st.booleans(), max_size=8))
def test_generated_tars_match_reference_and_tarfile(samples: list, fmt: int, dirs: list) -> None:
    data = build(samples, fmt, dirs)
    members, groups = native_table(data)
    assert (members, groups) == ref_table(data)
    assert members == tarfile_members(data)
    # WebDataset grouping: one sample per key, fields in archive order.
    assert len(groups) == len(samples)
    for (first, count), (key, flds) in zip(groups, samples, strict=True):
        assert count == len(flds)
        for (name, off, size), (fld, payload_) in zip(
            members[first : first + count], flds, strict=True
        ):
            assert name.decode() == f"{key}.{fld}"
            assert data[off : off + size] == payload_


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_empty_archive(fmt: int) -> None:
    data = tars.make_tar([], fmt)
    assert native_table(data) == ([], [])
    index = ShardIndex.build(data)
    assert len(index) == 0
    assert index.num_members == 0
    assert index.shard_size == len(data)


def test_empty_buffer_is_refused_and_end_blocks_only_is_empty() -> None:
    with pytest.raises(_native.FormatError, match="empty file"):
        native_table(b"")
    assert native_table(tars.end_blocks()) == ([], [])
    assert native_table(tars.end_blocks()[:512]) == ([], [])  # a lone zero block, as tarfile


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_long_names_each_format(fmt: int) -> None:
    key = "d" * 80 + "/" + "k" * 150
    if fmt == tarfile.USTAR_FORMAT:
        key = "p" * 140 + "/" + "k" * 90  # fits prefix + name
    data = tars.samples_tar([(key, [("jpg", b"1"), ("json", b"2")])], fmt)
    members, groups = native_table(data)
    assert [m[0].decode() for m in members] == [f"{key}.jpg", f"{key}.json"]
    assert groups == [(0, 2)]
    assert members == tarfile_members(data)


def test_fields_far_apart_and_multi_dot() -> None:
    data = tars.samples_tar(
        [("a", [("zzz", b"z"), ("seg.png", b"s"), ("aaa", b"a")]), ("b", [("x.y.z", b"q")])]
    )
    index = ShardIndex.build(data)
    assert index.fields(0) == ["zzz", "seg.png", "aaa"]
    assert index.fields(1) == ["x.y.z"]
    assert index.key(1) == "b"


def test_zero_size_members_and_directories() -> None:
    data = tars.make_tar(
        [
            ("top/", None),
            ("top/0001.jpg", b""),
            ("top/0001.txt", b""),
            ("x/", None),
            ("x/0.cls", b""),
        ]
    )
    index = ShardIndex.build(data)
    assert [index.sample(i) for i in range(len(index))] == [
        {"__key__": "top/0001", "jpg": (1024, 0), "txt": (1536, 0)},
        {"__key__": "x/0", "cls": (2560, 0)},
    ]


def test_skipped_members_do_not_break_adjacency() -> None:
    data = tars.make_tar(
        [
            ("a.jpg", b"1"),
            ("README", b"no dot"),
            (".hidden.txt", b"h"),
            ("sub/.hidden", b"h"),
            ("__meta__", b"m"),
            ("trailing.", b"t"),
            ("a.txt", b"2"),
        ]
    )
    members, groups = native_table(data)
    assert [m[0] for m in members] == [b"a.jpg", b"a.txt"]
    assert groups == [(0, 2)]


def test_global_pax_header_is_ignored() -> None:
    import io

    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "made by a test"}
    ) as tar:
        info = tarfile.TarInfo("k.bin")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    data = buf.getvalue()
    assert data[156:157] == b"g"
    members, _ = native_table(data)
    assert members == tarfile_members(data) == [(b"k.bin", members[0][1], 3)]


def test_pax_size_and_path_override_header() -> None:
    pax = tars.pax_record(b"path", b"long/" + b"n" * 200 + b".jpg") + tars.pax_record(b"size", b"5")
    data = (
        tars.raw_member(b"PaxHeader", pax, b"x")
        + tars.raw_header(b"short.jpg", 0)
        + tars.padded(b"HELLO")
        + tars.end_blocks()
    )
    members, groups = native_table(data)
    assert members == [(b"long/" + b"n" * 200 + b".jpg", 1536, 5)]
    assert groups == [(0, 1)]
    assert outcome(native_table, data) == outcome(ref_table, data)


def test_base256_size_and_old_formats() -> None:
    b256 = b"\x80" + (5).to_bytes(11, "big")
    data = (
        tars.raw_header(b"a.bin", b256)
        + tars.padded(b"12345")
        # old GNU magic: like tarfile, a non-empty prefix area is still a prefix
        + tars.raw_header(b"b.bin", 2, magic=b"ustar  \0", prefix=b"garbage")
        + tars.padded(b"xy")
        # v7: no magic; a regular entry ending in '/' is a directory
        + tars.raw_header(b"olddir/", 0, b"\0", magic=b"\0" * 8)
        + tars.raw_header(b"c.bin", 1, b"\0", magic=b"\0" * 8)
        + tars.padded(b"z")
        # POSIX ustar with a prefix
        + tars.raw_header(b"d.bin", 1, prefix=b"pre/fix")
        + tars.padded(b"w")
        + tars.end_blocks()
    )
    members, _ = native_table(data)
    assert [(m[0], m[2]) for m in members] == [
        (b"a.bin", 5),
        (b"garbage/b.bin", 2),
        (b"c.bin", 1),
        (b"pre/fix/d.bin", 1),
    ]
    assert [data[o : o + s] for _, o, s in members] == [b"12345", b"xy", b"z", b"w"]
    assert (members, native_table(data)[1]) == ref_table(data)
    assert members == tarfile_members(data)


def test_gnu_longname_and_longlink_records() -> None:
    name = b"g" * 300 + b".txt"
    data = (
        tars.raw_member(b"././@LongLink", name + b"\0", b"L", magic=b"ustar  \0")
        + tars.raw_member(b"././@LongLink", b"ignored-link\0", b"K", magic=b"ustar  \0")
        + tars.raw_member(b"g" * 99, b"data", magic=b"ustar  \0")
        + tars.raw_member(b"label", b"", b"V")
        + tars.end_blocks()
    )
    members, _ = native_table(data)
    assert [(m[0], m[2]) for m in members] == [(name, 4)]


def test_contiguous_type_is_a_regular_file() -> None:
    data = tars.raw_member(b"c.bin", b"abc", b"7") + tars.end_blocks()
    assert [m[0] for m in native_table(data)[0]] == [b"c.bin"]


def test_duplicate_key_not_adjacent_is_an_error() -> None:
    data = tars.make_tar([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.txt", b"3")])
    with pytest.raises(ShardFormatError, match="duplicate key 'a'") as info:
        ShardIndex.build(data, name="shard-x.tar")
    assert info.value.path == "shard-x.tar"
    assert info.value.offset == 2048


def test_duplicate_field_in_sample_is_an_error() -> None:
    data = tars.make_tar([("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(ShardFormatError, match="duplicate field 'jpg'"):
        ShardIndex.build(data)
