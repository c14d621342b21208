"""Members a shard must not contain are refused with ShardFormatError naming the file."""

from __future__ import annotations

import io
import tarfile

import pytest

from fastload import ShardFormatError, ShardIndex

from . import tars
from .conftest import outcome, ref_table


def tar_with(info: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        ok = tarfile.TarInfo("first.jpg")
        ok.size = 1
        tar.addfile(ok, io.BytesIO(b"x"))
        tar.addfile(info)
    return buf.getvalue()


def info(name: str, typ: bytes, linkname: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type = typ
    i.linkname = linkname
    return i


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (info("s.jpg", tarfile.SYMTYPE, "first.jpg"), "symbolic link 's.jpg'"),
        (info("h.jpg", tarfile.LNKTYPE, "first.jpg"), "hard link 'h.jpg'"),
        (info("c.dev", tarfile.CHRTYPE), "character device 'c.dev'"),
        (info("b.dev", tarfile.BLKTYPE), "block device 'b.dev'"),
        (info("f.fifo", tarfile.FIFOTYPE), "FIFO 'f.fifo'"),
        (info("/abs/x.jpg", tarfile.REGTYPE), "absolute member path '/abs/x.jpg'"),
        (info("../x.jpg", tarfile.REGTYPE), "'..' component in member path '../x.jpg'"),
        (info("a/../../x.jpg", tarfile.REGTYPE), "'..' component"),
        (info("a/..", tarfile.DIRTYPE), "'..' component"),
        (info("/", tarfile.DIRTYPE), "absolute member path"),
    ],
    ids=[
        "symlink",
        "hardlink",
        "chardev",
        "blockdev",
        "fifo",
        "abs",
        "dotdot",
        "dotdot2",
        "dotdot-dir",
        "root-dir",
    ],
)
def test_refused_members(member: tarfile.TarInfo, message: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tar_with(member)
    path = tmp_path / "shard-000007.tar"
    path.write_bytes(data)
    with pytest.raises(ShardFormatError, match=message.replace(".", r"\.")) as exc_info:
        ShardIndex.build(path)
    err = exc_info.value
    assert err.path == str(path)
    assert str(path) in str(err)
    # the second member (its PAX header if any) starts after the first's two blocks
    assert err.offset == 1024
    assert outcome(ref_table, data)[0] == "error"


def test_refused_from_buffer_uses_given_name() -> None:
    data = tar_with(info("s.jpg", tarfile.SYMTYPE, "first.jpg"))
    with pytest.raises(ShardFormatError, match=r"^s3://bucket/shard\.tar at byte 1024: ") as e:
        ShardIndex.build(memoryview(data), name="s3://bucket/shard.tar")
    assert e.value.path == "s3://bucket/shard.tar"


@pytest.mark.parametrize(
    ("typ", "message"), [(b"S", "GNU sparse"), (b"Z", "unsupported member type 'Z'")]
)
def test_sparse_and_unknown_types(typ: bytes, message: str) -> None:
    data = tars.raw_member(b"x.bin", b"abc", typ) + tars.end_blocks()
    with pytest.raises(ShardFormatError, match=message):
        ShardIndex.build(data)


def test_pax_sparse_refused() -> None:
    pax = tars.pax_record(b"GNU.sparse.major", b"1")
    data = tars.raw_member(b"P", pax, b"x") + tars.raw_member(b"x.bin", b"abc") + tars.end_blocks()
    with pytest.raises(ShardFormatError, match="sparse"):
        ShardIndex.build(data)


def test_nul_in_pax_path_refused() -> None:
    pax = tars.pax_record(b"path", b"a\0b.jpg")
    data = tars.raw_member(b"P", pax, b"x") + tars.raw_member(b"x.bin", b"abc") + tars.end_blocks()
    with pytest.raises(ShardFormatError, match="NUL byte"):
        ShardIndex.build(data)


def test_error_message_with_non_utf8_bytes() -> None:
    # found by hypothesis: the message quotes raw header bytes
    data = tars.raw_member(b"caf\xe9.jpg", b"abc", b"\x80") + tars.end_blocks()
    with pytest.raises(
        ShardFormatError, match=r"unsupported member type '\\x80' for 'caf\\xe9\.jpg'"
    ):
        ShardIndex.build(data)
