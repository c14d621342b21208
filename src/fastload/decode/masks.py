"""COCO segmentation masks: polygons, uncompressed and compressed RLE.

Uses ``pycocotools.mask`` when it is installed. The numpy fallback is a port of
pycocotools' C code (``maskApi.c``: ``rleFrPoly``, ``rleFrString``, ``rleDecode``), so
both backends give the same pixels — polygon rasterisation included, which
``ImageDraw.polygon`` would only approximate on the boundary.

RLE runs go down columns (Fortran order) and start with a run of zeros; masks are
``uint8 (height, width)`` with values 0/1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastload.decode._deps import pycocotools_mask
from fastload.errors import ConfigError, DecodeError, MissingDependencyError

__all__ = [
    "MASK_BACKENDS",
    "decode_rle",
    "polygon_to_mask",
    "rle_from_string",
    "rle_to_string",
    "segmentation_to_mask",
]

MASK_BACKENDS = ("auto", "pycocotools", "numpy")
_SCALE = 5.0  # pycocotools upsamples polygon vertices by 5 before tracing edges


def rle_from_string(s: str | bytes) -> np.ndarray:
    """Decode COCO's compressed RLE string (LEB128-like, 5 bits a char, deltas from
    the fourth count on) to run lengths (``uint32``). Raises :class:`DecodeError`."""
    data = s.encode("ascii", "replace") if isinstance(s, str) else bytes(s)
    counts: list[int] = []
    p, n = 0, len(data)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                raise DecodeError(f"compressed RLE ends inside a count at character {p}")
            c = data[p] - 48
            if not 0 <= c < 64:
                raise DecodeError(f"compressed RLE has an invalid character at {p}: {data[p]!r}")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x -= 1 << (5 * k)  # sign-extend
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x % 2**32)
    return np.asarray(counts, dtype=np.uint32)


def rle_to_string(counts: Sequence[int] | np.ndarray) -> str:
    """Encode run lengths as COCO's compressed RLE string (inverse of :func:`rle_from_string`)."""
    values = [int(c) for c in counts]
    out: list[str] = []
    for i, count in enumerate(values):
        x = count - values[i - 2] if i > 2 else count
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def decode_rle(counts: Sequence[int] | np.ndarray, height: int, width: int) -> np.ndarray:
    """Expand run lengths to a ``uint8 (height, width)`` mask.

    Raises :class:`DecodeError` when the runs do not cover exactly ``height * width``
    pixels (pycocotools would read or write out of bounds).
    """
    runs = np.asarray(counts, dtype=np.int64)
    total = int(runs.sum()) if runs.size else 0
    if runs.size and runs.min() < 0:
        raise DecodeError("RLE has a negative run length")
    if total != height * width:
        raise DecodeError(
            f"RLE runs cover {total} pixels, the mask is {height}x{width} = {height * width}"
        )
    values = (np.arange(runs.size) & 1).astype(np.uint8)
    flat = np.repeat(values, runs)
    return np.ascontiguousarray(flat.reshape(width, height).T)


def _toggles_to_mask(positions: np.ndarray, height: int, width: int) -> np.ndarray:
    # Each boundary position flips the state; coinciding flips cancel (as the merging
    # of zero-length runs in rleFrPoly does).
    n = height * width
    flips = np.bincount(positions, minlength=n + 1)[:n]
    flat = (np.cumsum(flips) & 1).astype(np.uint8)
    return np.ascontiguousarray(flat.reshape(width, height).T)


def polygon_to_mask(polygon: Sequence[float] | np.ndarray, height: int, width: int) -> np.ndarray:
    """Rasterise one COCO polygon ``[x0, y0, x1, y1, ...]`` exactly as pycocotools does.

    Returns ``uint8 (height, width)``. Raises :class:`DecodeError` for an odd number of
    coordinates or non-finite values.
    """
    xy = np.asarray(polygon, dtype=np.float64).ravel()
    if xy.size % 2 or not np.isfinite(xy).all():
        raise DecodeError(f"polygon needs an even number of finite coordinates, got {xy.size}")
    if xy.size == 0:
        return np.zeros((height, width), dtype=np.uint8)
    # C's (int)(v + .5) truncates toward zero.
    x = np.trunc(_SCALE * xy[0::2] + 0.5).astype(np.int64)
    y = np.trunc(_SCALE * xy[1::2] + 0.5).astype(np.int64)
    xs, ys = x, y
    xe, ye = np.roll(x, -1), np.roll(y, -1)
    dx, dy = np.abs(xe - xs), np.abs(ys - ye)
    major_x = dx >= dy
    flip = (major_x & (xs > xe)) | (~major_x & (ys > ye))
    xs, xe = np.where(flip, xe, xs), np.where(flip, xs, xe)
    ys, ye = np.where(flip, ye, ys), np.where(flip, ys, ye)
    steps = np.where(major_x, dx, dy)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(major_x, (ye - ys) / dx, (xe - xs) / dy)
    # A zero-length edge has a NaN slope in C too; its single point shares x with its
    # neighbours, so it never makes a boundary: give it a harmless slope.
    slope = np.where(steps == 0, 0.0, slope)
    lengths = steps + 1
    edge = np.repeat(np.arange(steps.size), lengths)
    starts = np.cumsum(lengths) - lengths
    d = np.arange(edge.size) - starts[edge]
    t = np.where(flip[edge], steps[edge] - d, d)
    along = t * slope[edge]
    mx = major_x[edge]
    u = np.where(mx, t + xs[edge], np.trunc(xs[edge] + along + 0.5).astype(np.int64))
    v = np.where(mx, np.trunc(ys[edge] + along + 0.5).astype(np.int64), t + ys[edge])

    # Points where the traced boundary crosses a pixel-centre column, downsampled.
    change = u[1:] != u[:-1]
    u1, u0 = u[1:][change], u[:-1][change]
    v1, v0 = v[1:][change], v[:-1][change]
    xd = np.where(u1 < u0, u1, u1 - 1).astype(np.float64)
    xd = (xd + 0.5) / _SCALE - 0.5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= width - 1)
    yd = np.minimum(v1, v0)[keep].astype(np.float64)
    yd = (yd + 0.5) / _SCALE - 0.5
    yd = np.ceil(np.clip(yd, 0, height))
    positions = xd[keep].astype(np.int64) * height + yd.astype(np.int64)
    return _toggles_to_mask(positions, height, width)


def _rle_size(segm: Mapping[str, Any]) -> tuple[int, int]:
    size = segm.get("size")
    if not isinstance(size, Sequence) or len(size) != 2:
        raise DecodeError(f"RLE segmentation needs 'size': [height, width], got {size!r}")
    return int(size[0]), int(size[1])


def segmentation_to_mask(
    segmentation: Any, height: int, width: int, *, backend: str = "auto"
) -> np.ndarray:
    """Decode one annotation's ``segmentation`` to a ``uint8 (height, width)`` mask.

    Accepts polygons (a list of coordinate lists, merged by union), uncompressed RLE
    (``{"counts": [ints], "size": [h, w]}``, as COCO's crowd annotations) and compressed
    RLE (``counts`` a string). ``backend``: ``"pycocotools"``, ``"numpy"`` or
    ``"auto"`` (pycocotools when installed). Like pycocotools' ``annToMask``.
    Raises :class:`DecodeError` for malformed segmentations or an RLE whose size is
    not ``(height, width)``; :class:`ConfigError` for a bad ``backend``.
    """
    if backend not in MASK_BACKENDS:
        raise ConfigError(f"mask backend must be one of {MASK_BACKENDS}, got {backend!r}")
    coco = pycocotools_mask() if backend != "numpy" else None
    if backend == "pycocotools" and coco is None:
        raise MissingDependencyError("pycocotools", "coco", "the pycocotools mask backend")
    try:
        if isinstance(segmentation, list):
            # Fewer than 3 points enclose nothing (pycocotools would read 4 numbers
            # as a box and reject fewer): skip them in both backends.
            polygons = [p for p in segmentation if len(p) >= 6]
            if not polygons:
                return np.zeros((height, width), dtype=np.uint8)
            if coco is not None:
                rle = coco.merge(coco.frPyObjects(polygons, height, width))
                return np.asarray(coco.decode(rle), dtype=np.uint8)
            mask = np.zeros((height, width), dtype=np.uint8)
            for polygon in polygons:
                mask |= polygon_to_mask(polygon, height, width)
            return mask
        if isinstance(segmentation, Mapping) and "counts" in segmentation:
            if _rle_size(segmentation) != (height, width):
                raise DecodeError(
                    f"RLE size {list(_rle_size(segmentation))} is not the image's "
                    f"[{height}, {width}]"
                )
            counts = segmentation["counts"]
            if isinstance(counts, (str, bytes)):
                runs = rle_from_string(counts)
                if coco is None or int(runs.sum()) != height * width:
                    # pycocotools does not check the runs; never let it overrun a buffer.
                    return decode_rle(runs, height, width)
                rle = {"size": [height, width], "counts": counts}
                return np.asarray(coco.decode(rle), dtype=np.uint8)
            runs = np.asarray(counts, dtype=np.int64)
            if runs.sum() != height * width or (runs.size and runs.min() < 0):
                # pycocotools does not check the runs; never let it overrun a buffer.
                return decode_rle(runs, height, width)
            if coco is not None:
                rle = coco.frPyObjects(dict(segmentation), height, width)
                return np.asarray(coco.decode(rle), dtype=np.uint8)
            return decode_rle(runs, height, width)
    except DecodeError:
        raise
    except Exception as e:
        raise DecodeError(f"malformed segmentation ({type(e).__name__}: {e})") from e
    raise DecodeError(
        f"segmentation must be polygons (list) or RLE (dict with counts and size), "
        f"got {type(segmentation).__name__}"
    )
