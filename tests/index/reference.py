"""Pure-Python reference of the C++ tar scanner (csrc/tar_scan.cc), rule for rule.

Written for clarity, not speed: the differential tests check that the C++ core
and this agree on every generated archive, members, samples and errors alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

BLOCK = 512
MAX_EXTENDED = 1 << 20
U64_MAX = (1 << 64) - 1

# error codes, as in csrc/tar_scan.h
TRUNCATED, BAD_CHECKSUM, BAD_HEADER, BAD_PAX, REFUSED, UNSAFE_PATH = 1, 2, 3, 4, 5, 6
DUPLICATE_KEY, DUPLICATE_FIELD, TOO_LARGE = 7, 8, 9
RESERVED_FIELD, TOO_MANY_FIELDS = 13, 14
MAX_FIELDS = 4096


class RefError(Exception):
    """A scan error: ``code`` and byte ``offset`` as the C++ core reports them."""

    def __init__(self, code: int, offset: int, message: str) -> None:
        super().__init__(f"[{code}] at {offset}: {message}")
        self.code = code
        self.offset = offset


@dataclass
class RefTable:
    """Members (name, data offset, size) and samples (first member, count)."""

    shard_size: int
    members: list[tuple[bytes, int, int]] = field(default_factory=list)
    samples: list[tuple[int, int]] = field(default_factory=list)


def _nts(b: bytes) -> bytes:
    i = b.find(b"\0")
    return b if i < 0 else b[:i]


def _number(b: bytes) -> int:
    """Parse a numeric field; raise ValueError (bad) or OverflowError (too large)."""
    if b[0] in (0x80, 0xFF):
        if b[0] == 0xFF:
            raise ValueError("negative base-256")
        v = int.from_bytes(b[1:], "big")
        if v > U64_MAX:
            raise OverflowError
        return v
    s = _nts(b).strip(b" \t\n\r\v\f")
    if not s:
        return 0
    if any(c < 0x30 or c > 0x37 for c in s):
        raise ValueError("not octal")
    v = int(s, 8)
    if v > U64_MAX:
        raise OverflowError
    return v


def _checksum_ok(h: bytes, stored: int) -> bool:
    hh = h[:148] + b" " * 8 + h[156:]
    unsigned = sum(hh)
    signed = sum(c - 256 if c > 127 else c for c in hh)
    return stored == unsigned or (signed >= 0 and stored == signed)


def _decimal(b: bytes) -> int | None:
    if not b or len(b) > 19 or not all(0x30 <= c <= 0x39 for c in b):
        return None
    return int(b)


def _parse_pax(body: bytes, base: int, pax: dict[str, object]) -> None:
    pos, n = 0, len(body)
    while pos < n:
        if not body[pos:].strip(b"\0"):
            break
        d = pos
        while d < n and d - pos < 20 and 0x30 <= body[d] <= 0x39:
            d += 1
        length = _decimal(body[pos:d])
        if length is None or d >= n or body[d] != 0x20:
            raise RefError(BAD_PAX, base + pos, "no valid length")
        if length < (d - pos) + 4 or length > n - pos:
            raise RefError(BAD_PAX, base + pos, "length does not fit")
        end = pos + length
        if body[end - 1] != 0x0A:
            raise RefError(BAD_PAX, base + pos, "no newline")
        kv = d + 1
        eq = body.find(b"=", kv, end - 1)
        if eq <= kv:
            raise RefError(BAD_PAX, base + pos, "no keyword")
        key, value = body[kv:eq], body[eq + 1 : end - 1]
        if key == b"path":
            pax["path"] = value
        elif key == b"size":
            v = _decimal(value)
            if v is None:
                raise RefError(BAD_PAX, base + pos, "bad size")
            pax["size"] = v
        elif key.startswith(b"GNU.sparse."):
            raise RefError(REFUSED, base + pos, "sparse")
        pos = end


def _unsafe(name: bytes) -> bool:
    if not name or b"\0" in name or name.startswith(b"/"):
        return True
    return b".." in name.split(b"/")


def _nul_inside(b: bytes) -> bool:
    i = b.find(b"\0")
    return i >= 0 and b[i:].count(0) != len(b) - i


def key_length(name: bytes) -> int | None:
    """Index of the key/field dot in ``name``, or None if it is not indexed."""
    top = name.split(b"/", 1)[0]
    if len(top) >= 4 and top.startswith(b"__") and top.endswith(b"__"):
        return None
    base = name.rfind(b"/") + 1
    dot = name.find(b".", base)
    if dot < 0 or dot == base or dot + 1 == len(name):
        return None
    return dot


def members(data: bytes) -> Iterator[tuple[bytes, int, int, int]]:
    """The header parser: regular-file members ``(name, header offset, data offset,
    size)`` in archive order, lazily (so errors come in archive order when grouped);
    raise RefError like the C++ ``HeaderParser``."""
    n = len(data)
    pos = 0
    pending = False
    ext_start = 0
    ext_name: bytes | None = None
    ext_size: int | None = None
    global_start: int | None = None
    while True:
        if pos == n:
            if pending or global_start is not None:
                where = ext_start if pending else global_start
                raise RefError(TRUNCATED, where, "dangling extended header")  # type: ignore[arg-type]
            raise RefError(TRUNCATED, pos, "no end-of-archive block")
        if n - pos < BLOCK:
            raise RefError(TRUNCATED, pos, "truncated header")
        h = data[pos : pos + BLOCK]
        if h.count(0) == BLOCK:
            if pending or global_start is not None:
                where = ext_start if pending else global_start
                raise RefError(TRUNCATED, where, "dangling extended header")  # type: ignore[arg-type]
            return
        try:
            stored = _number(h[148:156])
        except (ValueError, OverflowError):
            raise RefError(BAD_HEADER, pos, "checksum field") from None
        if not _checksum_ok(h, stored):
            raise RefError(BAD_CHECKSUM, pos, "checksum")
        for a, b in ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345)):
            if h[a] in (0x80, 0xFF):
                continue
            try:
                _number(h[a:b])
            except (ValueError, OverflowError):
                raise RefError(BAD_HEADER, pos, "unused numeric field") from None
        try:
            size = _number(h[124:136])
        except OverflowError:
            raise RefError(TOO_LARGE, pos, "size") from None
        except ValueError:
            raise RefError(BAD_HEADER, pos, "size") from None
        typ = h[156:157]
        raw_name = _nts(h[0:100])
        prefix = _nts(h[345:500])  # joined whatever the magic, as tarfile does
        name_nul = _nul_inside(h[0:100]) or _nul_inside(h[345:500])
        data_off = pos + BLOCK
        extended = typ in (b"x", b"g", b"L", b"K")
        if not extended and ext_size is not None:
            size = ext_size
        if size > U64_MAX - (BLOCK - 1):
            raise RefError(TOO_LARGE, pos, "size")
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        fits = padded <= n - data_off
        body = data[data_off : data_off + size]
        if extended:
            if not fits:
                raise RefError(TRUNCATED, pos, "data")
            if size > MAX_EXTENDED:
                raise RefError(TOO_LARGE, pos, "extended header")
            if typ != b"g" and not pending:
                pending, ext_start = True, pos
            if typ == b"g" and global_start is None:
                global_start = pos
            if typ in (b"x", b"g"):
                pax: dict[str, object] = {}
                _parse_pax(body, data_off, pax)
                if typ == b"g":
                    if "path" in pax or "size" in pax:
                        raise RefError(REFUSED, pos, "global path/size")
                else:
                    if "path" in pax and ext_name is None:
                        ext_name = bytes(pax["path"]).rstrip(b"/")  # type: ignore[call-overload]
                    if "size" in pax and ext_size is None:
                        ext_size = int(pax["size"])  # type: ignore[call-overload]
            elif typ == b"L":
                if _nul_inside(body):
                    raise RefError(UNSAFE_PATH, pos, "NUL inside long name")
                if ext_name is None:
                    ext_name = _nts(body)
            pos = data_off + padded
            continue
        global_start = None
        member_pos = ext_start if pending else pos
        if ext_name is not None:
            name = ext_name
        else:
            if name_nul:
                raise RefError(UNSAFE_PATH, member_pos, "NUL inside name")
            name = prefix + b"/" + raw_name if prefix else raw_name
        pending, ext_name, ext_size = False, None, None
        is_dir = typ == b"5" or (typ == b"\0" and raw_name.endswith(b"/"))
        is_reg = not is_dir and typ in (b"0", b"\0", b"7")
        if not is_dir and not is_reg:
            if typ == b"V":
                if not fits:
                    raise RefError(TRUNCATED, pos, "data")
                pos = data_off + padded
                continue
            raise RefError(REFUSED, member_pos, f"type {typ!r}")
        check = name
        if is_dir:
            while len(check) > 1 and check.endswith(b"/"):
                check = check[:-1]
        if _unsafe(check):
            raise RefError(UNSAFE_PATH, member_pos, "unsafe path")
        if is_dir:
            pos = data_off
            continue
        if not fits:
            raise RefError(TRUNCATED, pos, "data")
        yield (name, member_pos, data_off, size)
        pos = data_off + padded


def group(found: Iterable[tuple[bytes, int, int, int]], shard_size: int) -> RefTable:
    """The sample grouper over ``members()``'s output, like the C++ ``SampleGrouper``."""
    table = RefTable(shard_size=shard_size)
    seen: dict[bytes, int] = {}
    current: bytes | None = None
    fields: set[bytes] = set()
    for name, member_pos, data_off, size in found:
        kl = key_length(name)
        if kl is None:
            continue
        key, fld = name[:kl], name[kl + 1 :]
        if fld.startswith(b"__"):
            raise RefError(RESERVED_FIELD, member_pos, "reserved field")
        if current is not None and key == current:
            first, count = table.samples[-1]
            if count >= MAX_FIELDS:
                raise RefError(TOO_MANY_FIELDS, member_pos, "too many fields")
            if fld in fields:
                raise RefError(DUPLICATE_FIELD, member_pos, "duplicate field")
            table.samples[-1] = (first, count + 1)
        else:
            if key in seen:
                raise RefError(DUPLICATE_KEY, member_pos, "duplicate key")
            seen[key] = len(table.samples)
            current = key
            fields = set()
            table.samples.append((len(table.members), 1))
        fields.add(fld)
        table.members.append((name, data_off, size))
    return table


def scan(data: bytes) -> RefTable:
    """Scan ``data`` like ``fastload._native.scan``; raise RefError on the same inputs."""
    return group(members(data), len(data))
