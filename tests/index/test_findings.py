"""The indexer review's findings, each pinned: end-of-archive check, reserved field
names, repeated and global extended headers as tarfile reads them, ``__*__/``
directories, NULs inside names, the per-sample field cap, ``ShardFormatError.code``
and a file that shrinks under a reader."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fastload import ShardFormatError, ShardIndex, ShardReader, ShardWriter
from fastload.shards.index import ERROR_CODES

from . import tars
from .conftest import native_table, tarfile_members

SRC = Path(__file__).resolve().parents[2] / "src"


def members_tar(n: int) -> bytes:
    return tars.samples_tar([(f"{k:05d}", [("jpg", b"x" * 100), ("cls", b"1")]) for k in range(n)])


def refused(data: bytes, code: str) -> ShardFormatError:
    with pytest.raises(ShardFormatError) as info:
        ShardIndex.build(data, name="shard.tar")
    assert info.value.code == code, info.value
    assert "shard.tar" in str(info.value)
    return info.value


def test_shard_cut_on_a_block_boundary_is_refused(tmp_path: Path) -> None:
    data = members_tar(100)
    table, _ = native_table(data)
    cut = table[100][1] - 512  # at the header of member 100 (sample 50)
    err = refused(data[:cut], "truncated")
    assert err.offset == cut
    assert "end-of-archive" in str(err)
    # also from a path, through ShardReader without a sidecar, and a 0-byte file
    path = tmp_path / "cut.tar"
    path.write_bytes(data[:cut])
    with pytest.raises(ShardFormatError, match="end-of-archive"):
        ShardReader(path)
    path.write_bytes(b"")
    with pytest.raises(ShardFormatError, match="empty file") as info:
        ShardIndex.build(path)
    assert info.value.code == "truncated"


def test_stale_sidecar_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    path.write_bytes(members_tar(10))
    ShardIndex.build(path).save(str(path) + ".idx")
    assert len(ShardIndex.for_shard(path)) == 10
    path.write_bytes(members_tar(4))  # rewritten after indexing
    with pytest.raises(ShardFormatError, match="stale index"):
        ShardIndex.for_shard(path)
    with pytest.raises(ShardFormatError, match="stale index"):
        ShardReader(path)


@pytest.mark.parametrize("field", ["__key__", "__url__", "__x"])
def test_reserved_field_names_are_refused(field: str) -> None:
    data = tars.make_tar([("k.jpg", b"1"), (f"k.{field}", b"other")])
    err = refused(data, "reserved_field")
    assert field in str(err)


def _ext(typ: bytes, body: bytes) -> bytes:
    return tars.raw_header(b"././@LongLink" if typ == b"L" else b"pax", len(body), typ) + (
        tars.padded(body)
    )


def _pax(**kv: bytes) -> bytes:
    return b"".join(tars.pax_record(k.encode(), v) for k, v in kv.items())


@pytest.mark.parametrize(
    ("headers", "want_name", "want_size"),
    [
        ([(b"x", _pax(path=b"a.jpg")), (b"x", _pax(path=b"b.jpg"))], b"a.jpg", 3),
        ([(b"L", b"a.jpg\0"), (b"L", b"b.jpg\0")], b"a.jpg", 3),
        ([(b"L", b"a.jpg\0"), (b"x", _pax(path=b"b.jpg"))], b"a.jpg", 3),
        ([(b"x", _pax(path=b"b.jpg")), (b"L", b"a.jpg\0")], b"b.jpg", 3),
        ([(b"x", _pax(size=b"2")), (b"x", _pax(size=b"3", path=b"c.txt"))], b"c.txt", 2),
        ([(b"x", _pax(path=b"d.jpg/"))], b"d.jpg", 3),
        ([(b"x", _pax(path=b"e.jpg", comment=b"hi"))], b"e.jpg", 3),
    ],
)
def test_repeated_extended_headers_resolve_as_tarfile(
    headers: list[tuple[bytes, bytes]], want_name: bytes, want_size: int
) -> None:
    data = b"".join(_ext(t, b) for t, b in headers)
    data += tars.raw_member(b"raw.bin", b"abc") + tars.end_blocks()
    members, _ = native_table(data)
    assert [(m[0], m[2]) for m in members] == [(want_name, want_size)]
    assert members == tarfile_members(data)


def test_global_pax_headers() -> None:
    # what `git archive` writes: a global comment, harmless
    ok = _ext(b"g", _pax(comment=b"0123abcd")) + tars.raw_member(b"k.txt", b"1")
    members, _ = native_table(ok + tars.end_blocks())
    assert [m[0] for m in members] == [b"k.txt"]
    for key in ("path", "size"):
        bad = _ext(b"g", _pax(**{key: b"7"})) + tars.raw_member(b"k.txt", b"1")
        err = refused(bad + tars.end_blocks(), "refused_member")
        assert f"global PAX header sets '{key}'" in str(err)
        assert err.offset == 0


def test_metadata_directories_are_skipped_like_webdataset() -> None:
    data = tars.make_tar(
        [
            ("__meta__/a.json", b"{}"),
            ("__x__/deep/k.jpg", b"1"),
            ("__info__", b"i"),
            ("k.jpg", b"2"),
            ("sub/__meta__/b.json", b"3"),  # not top-level: a sample, as in webdataset
        ]
    )
    members, groups = native_table(data)
    assert [m[0] for m in members] == [b"k.jpg", b"sub/__meta__/b.json"]
    assert groups == [(0, 1), (1, 1)]


def test_nul_inside_a_name_is_refused() -> None:
    long = _ext(b"L", b"a.jpg\0hidden.jpg\0") + tars.raw_member(b"raw", b"1")
    assert refused(long + tars.end_blocks(), "unsafe_path").offset == 0
    field = tars.raw_member(b"ab.jpg\0cd.jpg", b"1")
    assert "NUL" in str(refused(field + tars.end_blocks(), "unsafe_path"))
    # a PAX path with a NUL is refused too
    pax = _ext(b"x", _pax(path=b"a.jpg\0b")) + tars.raw_member(b"raw", b"1")
    refused(pax + tars.end_blocks(), "unsafe_path")


def test_fields_per_sample_are_capped_and_checked_by_hash() -> None:
    many = [(f"k.f{i}", b"") for i in range(4096)]
    data = tars.make_tar(many, tarfile.GNU_FORMAT)
    _, groups = native_table(data)
    assert groups == [(0, 4096)]
    refused(tars.make_tar([*many, ("k.extra", b"")], tarfile.GNU_FORMAT), "too_many_fields")
    # a repeat far into a big sample is found (by the hash set, past the first 16)
    dup = tars.make_tar([*many[:3000], ("k.f2500", b"")], tarfile.GNU_FORMAT)
    err = refused(dup, "duplicate_field")
    assert "'f2500'" in str(err)


def test_every_error_code_is_named() -> None:
    assert set(ERROR_CODES) == set(range(1, 15))
    refused(b"\x01" * 512 + tars.end_blocks(), "bad_header")
    refused(tars.raw_header(b"k.txt", fix_checksum=False) + tars.end_blocks(), "bad_checksum")
    sym = tars.raw_header(b"k.lnk", 0, b"2", linkname=b"x") + tars.end_blocks()
    assert refused(sym, "refused_member")
    dup = tars.make_tar([("a.jpg", b""), ("b.jpg", b""), ("a.cls", b"")])
    assert refused(dup, "duplicate_key")


def test_reader_not_mapped_turns_a_shrunk_file_into_an_error(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    with ShardWriter(str(tmp_path / "ds"), shard_size="1GB") as w:
        for k in range(20):
            w.write({"__key__": f"{k:03d}", "bin": os.urandom(5000)})
    src = tmp_path / "ds" / "shard-000000.tar"
    path.write_bytes(src.read_bytes())
    with ShardReader(path, mapped=False) as reader:
        first = reader[0]["bin"]
        assert isinstance(first, bytes)
        assert len(first) == 5000
        os.truncate(path, 4096)
        with pytest.raises(ShardFormatError, match="changed since it was opened") as info:
            reader[19]
        assert info.value.code == "io"


_SHRINKER = """
import os, sys, threading
from fastload import ShardIndex, ShardFormatError
path, data = sys.argv[1], open(sys.argv[2], "rb").read()
outcomes = {"ok": 0, "error": 0}
for i in range(int(sys.argv[3])):
    with open(path, "wb") as f:
        f.write(data)
    t = threading.Thread(target=os.truncate, args=(path, (i * 7919) % len(data)))
    t.start()
    try:
        ShardIndex.build(path)
        outcomes["ok"] += 1
    except ShardFormatError as exc:
        assert exc.code in ("io", "truncated"), exc
        outcomes["error"] += 1
    t.join()
print(outcomes)
"""


def test_scanning_a_file_that_shrinks_never_kills_the_process(tmp_path: Path) -> None:
    """A file truncated while it is scanned (from another thread, at varying sizes)
    gives a ShardFormatError or a clean scan, never SIGBUS."""
    data = tars.samples_tar([(f"{k:06d}", [("bin", b"z" * 700)]) for k in range(3000)])
    (tmp_path / "src.tar").write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-c", _SHRINKER, str(tmp_path / "s.tar"), str(tmp_path / "src.tar"), "60"],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "ok" in proc.stdout


def test_tarfile_agrees_on_the_writer_output(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for k in range(5):
            info = tarfile.TarInfo(f"{k}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"a"))
    assert native_table(buf.getvalue())[0] == tarfile_members(buf.getvalue())
