"""Differential fuzzing of the C++ tar scanner against Python's tarfile and
webdataset's grouping (and the pure-Python reference scanner).

Generates tar archives (ustar, GNU, PAX, v7 headers; GNU base-256 sizes; odd data
sizes; long and non-ASCII names; directories, webdataset metadata, repeated and
global extended headers, links; archives ending with two, one or no zero blocks,
tarfile's record padding or trailing bytes), mutates some of them (cut at a byte
or block boundary, a byte flipped with or without fixing the header checksum),
and checks on every one:

* fastload and ``tests/index/reference.py`` give the same table or the same error;
* when fastload accepts: tarfile accepts too and its regular members (name, data
  offset, size), filtered by fastload's sample rule, are fastload's members; and
  webdataset's ``tar_file_iterator`` + ``group_by_keys`` give the same samples
  with the same bytes (unless the archive has a name webdataset reads differently
  by design: a hidden basename below a directory, or a name ending in ``.``);
* when tarfile fails: fastload fails too (it never accepts what tarfile rejects);
* when fastload refuses what tarfile reads: the refusal is a documented strictness
  (counted per code in the report).

usage: python fuzz/diff_tarfile.py [--seconds S | --cases N] [--seed SEED] [--save DIR]
Exit status 1 on the first disagreement (the archive is saved under --save).
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "index"))
sys.path.insert(0, str(ROOT / "src"))

import reference  # noqa: E402  (tests/index/reference.py)

from fastload import _native  # noqa: E402
from fastload.shards.index import ERROR_CODES  # noqa: E402

BLOCK = 512
#: Refusals of archives tarfile reads: fastload is stricter by design (see csrc/tar_scan.h).
STRICTER = {
    "truncated",  # no end-of-archive block; tarfile accepts a missing one
    "bad_checksum",  # tarfile ends the archive silently at a bad header after the first
    "bad_header",
    "bad_pax",  # tarfile reads a bad PAX size as 0
    "refused_member",  # links, devices, sparse, unknown types, global path/size
    "unsafe_path",  # absolute, "..", NUL inside, empty names
    "duplicate_key",  # webdataset would make two samples of one key
    "duplicate_field",  # webdataset raises ValueError
    "reserved_field",  # webdataset raises or overwrites __key__
    "too_many_fields",
    "too_large",
}

FIELDS = ["jpg", "json", "cls", "txt", "seg.png", "a.b", "png", "x"]
WORDS = ["s", "k", "img", "dir/a", "v1.0/b", "ключ", "日本", "Mixed", "x" * 40]


def pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def checksum(h: bytearray) -> None:
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}".encode() + b"\0 "


def raw_header(name: bytes, size: int, typ: bytes, *, magic: bytes, b256: bool = False) -> bytes:
    h = bytearray(BLOCK)
    h[0 : min(100, len(name))] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    if b256:
        h[124:136] = b"\x80" + size.to_bytes(11, "big")
    else:
        h[124:136] = f"{size:011o}".encode() + b"\0"
    h[136:148] = b"00000000000\0"
    h[156:157] = typ
    h[257:265] = magic
    if magic == b"ustar\x0000":
        h[265:297] = b"u".ljust(32, b"\0")
    checksum(h)
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def ext(typ: bytes, body: bytes, magic: bytes = b"ustar\x0000") -> bytes:
    name = b"././@LongLink" if typ in (b"L", b"K") else b"PaxHeader"
    return raw_header(name, len(body), typ, magic=magic) + padded(body)


class Gen:
    """One random archive."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def name(self) -> str:
        r = self.rng
        key = r.choice(WORDS) + str(r.randrange(50))
        if r.random() < 0.08:
            key = "d" * r.randrange(60, 120) + "/" + "k" * r.randrange(1, 160)
        if r.random() < 0.05:
            key = r.choice(["__meta__/", "__x__/deep/", "sub/__m__/", "./", ".hid/"]) + key
        fld = r.choice(FIELDS)
        if r.random() < 0.04:
            fld = r.choice(["__key__", "", "JPG", "__x"])
        if r.random() < 0.03:
            return r.choice(["__info__", "noext", "/abs.jpg", "a/../b.jpg", "x/.hidden.jpg",
                             ".top.jpg", "tr.", "k\0nul.jpg", ""])  # fmt: skip
        return f"{key}.{fld}"

    def data(self) -> bytes:
        r = self.rng
        n = r.choice([0, 1, 100, 511, 512, 513, 1024, r.randrange(3000)])
        return bytes(r.randrange(256) for _ in range(min(n, 64))) * (n // 64 + 1)

    def tarfile_member(self, name: str, data: bytes | None, fmt: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.mtime = 0
        if data is None:
            info.type = tarfile.DIRTYPE
        else:
            info.size = len(data)
        try:
            head = info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape")
        except ValueError:  # e.g. a name too long for ustar: fall back to PAX
            head = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
        return head + (padded(data) if data else b"")

    def archive(self) -> bytes:
        r = self.rng
        fmt = r.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
        out = bytearray()
        if r.random() < 0.1:
            body = pax_record(b"comment", b"abc123")
            if r.random() < 0.2:
                body += pax_record(r.choice([b"path", b"size"]), b"5")
            out += ext(b"g", body)
        samples = r.randrange(0, 8)
        keys = []
        for _ in range(samples):
            base = r.choice(WORDS) + str(r.randrange(1000))
            if r.random() < 0.1 and keys:
                base = r.choice(keys)  # a repeated key: adjacent or not
            keys.append(base)
            for fld in r.sample(FIELDS, r.randrange(1, 4)):
                out += self.member(f"{base}.{fld}", fmt)
        for _ in range(r.randrange(0, 4)):
            out += self.member(self.name(), fmt)
        end = r.random()
        if end < 0.6:
            out += b"\0" * (2 * BLOCK)
        elif end < 0.75:
            out += b"\0" * BLOCK
        elif end < 0.85:
            out += b"\0" * (2 * BLOCK)
            out += b"\0" * (-len(out) % 10240)
        elif end < 0.92:
            out += b"\0" * (2 * BLOCK) + b"trailing garbage"
        # else: no end-of-archive block at all
        return bytes(out)

    def member(self, name: str, fmt: int) -> bytes:
        r = self.rng
        kind = r.random()
        data = self.data()
        raw = name.encode("utf-8", "surrogateescape")
        if kind < 0.55 or len(raw) > 100:
            if r.random() < 0.05:
                return self.tarfile_member(name.rsplit(".", 1)[0], None, fmt)  # a directory
            return self.tarfile_member(name, data, fmt)
        if kind < 0.62:  # v7 header (no magic)
            return raw_header(raw, len(data), b"\0", magic=b"\0" * 8) + padded(data)
        if kind < 0.68:  # GNU base-256 size
            return raw_header(raw, len(data), b"0", magic=b"ustar  \0", b256=True) + padded(data)
        if kind < 0.76:  # repeated extended headers, in some order
            other = self.name().encode("utf-8", "surrogateescape")
            parts = [
                ext(b"x", pax_record(b"path", raw)),
                ext(b"L", raw + b"\0"),
                ext(b"x", pax_record(b"path", other)),
                ext(b"L", other + b"\0"),
            ]
            r.shuffle(parts)
            head = b"".join(parts[: r.randrange(1, 4)])
            return (
                head
                + raw_header(b"placeholder", len(data), b"0", magic=b"ustar\x0000")
                + (padded(data))
            )
        if kind < 0.82:  # a PAX size that overrides the header's
            body = pax_record(b"path", raw) + pax_record(b"size", str(len(data)).encode())
            if r.random() < 0.3:
                body = pax_record(b"size", str(len(data)).encode()) + body  # repeated key
            return ext(b"x", body) + raw_header(b"p", 0, b"0", magic=b"ustar\x0000") + padded(data)
        if kind < 0.86:  # links, FIFOs, volume labels, contiguous files
            typ = r.choice([b"1", b"2", b"6", b"V", b"7", b"K"])
            if typ == b"K":
                return ext(b"K", b"target\0") + raw_header(raw, 0, b"2", magic=b"ustar\x0000")
            body = data if typ in (b"V", b"7") else b""
            return raw_header(raw, len(body), typ, magic=b"ustar\x0000") + padded(body)
        if kind < 0.9:  # v7 directory: a regular entry whose name ends in '/'
            return raw_header(raw.rsplit(b".", 1)[0] + b"/", 0, b"\0", magic=b"\0" * 8)
        # a plain ustar header with this name (may be refused or odd)
        return raw_header(raw, len(data), b"0", magic=b"ustar\x0000") + padded(data)

    def mutate(self, data: bytes) -> bytes:
        r = self.rng
        x = r.random()
        if not data or x < 0.55:
            return data
        if x < 0.7:
            return data[: r.randrange(len(data) + 1)]
        if x < 0.8:
            return data[: r.randrange(len(data) // BLOCK + 1) * BLOCK]
        b = bytearray(data)
        at = r.randrange(len(b))
        b[at] = r.randrange(256)
        if x < 0.92:
            start = at // BLOCK * BLOCK
            if start + BLOCK <= len(b) and any(b[start : start + BLOCK]):
                head = bytearray(b[start : start + BLOCK])
                checksum(head)
                b[start : start + BLOCK] = head
        return bytes(b)


# ---------------------------------------------------------------- the three readers
def fastload_table(data: bytes) -> tuple[str, Any]:
    try:
        r = _native.scan(data)
    except _native.FormatError as exc:
        return "error", (ERROR_CODES[exc.args[2]], exc.args[1])
    names, no = r["names"], r["name_offsets"].tolist()
    members = [
        (names[no[i] : no[i + 1]], int(o), int(s))
        for i, (o, s) in enumerate(zip(r["offsets"].tolist(), r["sizes"].tolist(), strict=True))
    ]
    samples = list(zip(r["sample_first"].tolist(), r["sample_count"].tolist(), strict=True))
    return "ok", (members, samples)


def reference_table(data: bytes) -> tuple[str, Any]:
    try:
        t = reference.scan(data)
    except reference.RefError as exc:
        return "error", (ERROR_CODES[exc.code], exc.offset)
    return "ok", (t.members, t.samples)


def tarfile_members(data: bytes) -> tuple[str, Any]:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            out = [
                (m.name.encode("utf-8", "surrogateescape"), m.offset_data, m.size)
                for m in tf
                if m.isreg()
            ]
    except (tarfile.TarError, EOFError, ValueError, UnicodeError, OverflowError) as exc:
        return "error", type(exc).__name__
    return "ok", out


def webdataset_samples(data: bytes) -> tuple[str, Any]:
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    try:
        files = ({**f, "__url__": "x"} for f in tar_file_iterator(io.BytesIO(data)))
        out = [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(files)]
    except Exception as exc:  # any failure is an outcome to compare
        return "error", type(exc).__name__
    return "ok", out


def wds_comparable(names: list[bytes]) -> bool:
    """False if some member is one webdataset reads differently by design."""
    for n in names:
        base = n.rsplit(b"/", 1)[-1]
        if (b"/" in n and base.startswith(b".")) or n.endswith(b"."):
            return False
        if b"\n" in n:
            return False
    return True


def check(data: bytes, stats: Counter[str]) -> str | None:
    """None if the readers agree on ``data``, else what disagrees."""
    fl = fastload_table(data)
    ref = reference_table(data)
    if fl != ref:
        return f"fastload {fl!r} != reference {ref!r}"
    tf = tarfile_members(data)
    if fl[0] == "error":
        code = fl[1][0]
        if tf[0] == "ok":
            stats[f"refused ({code}), tarfile reads it"] += 1
            if code not in STRICTER:
                return f"fastload refuses with {code}, tarfile reads {tf[1]!r}"
        else:
            stats[f"refused ({code}), tarfile fails too"] += 1
        return None
    if tf[0] == "error":
        return f"fastload accepts {fl[1]!r}, tarfile fails: {tf[1]}"
    members, samples = fl[1]
    want = [m for m in tf[1] if reference.key_length(m[0]) is not None]
    if members != want:
        return f"members differ: fastload {members!r} tarfile {want!r}"
    stats["accepted"] += 1
    if not wds_comparable([m[0] for m in tf[1]]):
        stats["accepted, webdataset differs by design"] += 1
        return None
    wd = webdataset_samples(data)
    if wd[0] == "error":
        return f"fastload accepts, webdataset fails: {wd[1]}"
    ours = []
    for first, count in samples:
        name = members[first][0]
        kl = reference.key_length(name)
        assert kl is not None
        s: dict[str, Any] = {"__key__": name[:kl].decode("utf-8", "surrogateescape")}
        for m in range(first, first + count):
            n, off, size = members[m]
            s[n[kl + 1 :].decode("utf-8", "surrogateescape").lower()] = data[off : off + size]
        ours.append(s)
    if ours != wd[1]:
        return f"samples differ: fastload {ours!r} webdataset {wd[1]!r}"
    stats["accepted, same samples as webdataset"] += 1
    return None


def run(
    cases: int | None, seconds: float | None, seed: int, save: Path | None
) -> tuple[int, Counter[str]]:
    """Check archives until ``cases`` or ``seconds`` run out; return ``(exit status,
    counts of outcomes)``."""
    rng = random.Random(seed)
    gen = Gen(rng)
    stats: Counter[str] = Counter()
    start = time.monotonic()
    n = 0
    while (cases is None or n < cases) and (seconds is None or time.monotonic() - start < seconds):
        data = gen.mutate(gen.archive())
        n += 1
        problem = check(data, stats)
        if problem is not None:
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
                (save / f"diff-{seed}-{n}.tar").write_bytes(data)
            print(f"case {n} (seed {seed}): {problem}", file=sys.stderr)
            return 1, stats
    elapsed = time.monotonic() - start
    rate = n / max(elapsed, 1e-9)
    print(f"{n} archives in {elapsed:.1f}s ({rate:.0f}/s), seed {seed}: no disagreement")
    for what, count in sorted(stats.items()):
        print(f"  {count:8d}  {what}")
    return 0, stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", type=Path, default=None, help="where a disagreeing archive goes")
    a = p.parse_args(argv)
    if a.cases is None and a.seconds is None:
        a.seconds = 30.0
    return run(a.cases, a.seconds, a.seed, a.save)[0]


if __name__ == "__main__":
    sys.exit(main())
