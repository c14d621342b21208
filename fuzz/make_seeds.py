"""Write the fuzz seed corpus (generated, never committed): small tars in every
format the scanner reads, edge cases, and index sidecars of some of them.

usage: python fuzz/make_seeds.py OUT_DIR
"""

from __future__ import annotations

import io
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path


def tar(entries: Sequence[tuple[str, bytes | None, bytes]], fmt: int, **kw: object) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, **kw) as t:  # type: ignore[call-overload]
        for name, data, typ in entries:
            info = tarfile.TarInfo(name)
            info.type = typ
            if typ in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "k0.jpg"
            if data is None:
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def seeds() -> dict[str, bytes]:
    reg, dirt = tarfile.REGTYPE, tarfile.DIRTYPE
    basic = [
        ("d/", None, dirt),
        ("k0.jpg", b"J" * 700, reg),
        ("k0.json", b'{"a": 1}', reg),
        ("dir/k1.seg.png", b"", reg),
        ("dir/k1.cls", b"3", reg),
        ("README", b"no key", reg),
    ]
    long = [("L" * 150 + "/0001.jpg", b"long", reg), ("L" * 150 + "/0001.txt", b"t", reg)]
    out: dict[str, bytes] = {"empty.tar": b"", "end-only.tar": b"\0" * 1024}
    for fname, fmt in (
        ("ustar", tarfile.USTAR_FORMAT),
        ("gnu", tarfile.GNU_FORMAT),
        ("pax", tarfile.PAX_FORMAT),
    ):
        out[f"basic-{fname}.tar"] = tar(basic, fmt)
        if fmt != tarfile.USTAR_FORMAT:
            out[f"long-{fname}.tar"] = tar(long + basic[1:3], fmt)
    out["global-pax.tar"] = tar(basic[1:3], tarfile.PAX_FORMAT, pax_headers={"comment": "seed"})
    out["symlink.tar"] = tar([("s.jpg", None, tarfile.SYMTYPE)], tarfile.PAX_FORMAT)
    out["hardlink.tar"] = tar([("h.jpg", None, tarfile.LNKTYPE)], tarfile.GNU_FORMAT)
    out["fifo.tar"] = tar([("f.jpg", None, tarfile.FIFOTYPE)], tarfile.USTAR_FORMAT)
    out["dotdot.tar"] = tar([("../x.jpg", b"x", reg)], tarfile.PAX_FORMAT)
    out["duplicate-key.tar"] = tar(
        [("a.jpg", b"1", reg), ("b.jpg", b"2", reg), ("a.txt", b"3", reg)], tarfile.USTAR_FORMAT
    )
    many = [
        (f"{i:06x}.{f}", bytes([i % 256]) * (i % 600), reg)
        for i in range(40)
        for f in ("jpg", "json")
    ]
    out["many.tar"] = tar(many, tarfile.USTAR_FORMAT)
    truncated = out["basic-pax.tar"]
    out["truncated.tar"] = truncated[: len(truncated) // 2 + 7]
    try:  # index sidecars, when the extension is built
        from fastload import _native

        for name in ("basic-pax.tar", "long-gnu.tar", "many.tar", "end-only.tar"):
            out[name + ".idx"] = _native.build_index(out[name])
    except ImportError:
        pass
    return out


def main() -> None:
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (target / name).write_bytes(data)
    print(f"wrote {len(seeds())} seeds to {target}")


if __name__ == "__main__":
    main()
