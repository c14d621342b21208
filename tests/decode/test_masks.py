"""COCO masks: the numpy fallback against pycocotools, pixel for pixel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as coco_mask

from fastload.decode import (
    decode_rle,
    polygon_to_mask,
    rle_from_string,
    rle_to_string,
    segmentation_to_mask,
)
from fastload.errors import ConfigError, DecodeError

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _pycoco_poly(polygons: list[list[float]], h: int, w: int) -> np.ndarray:
    return np.asarray(coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(polygons, h, w))))


def _star(rng: np.random.Generator, h: int, w: int, k: int) -> list[float]:
    cx, cy = rng.uniform(0, w), rng.uniform(0, h)
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = rng.uniform(1, max(h, w) / 2, k)
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1).ravel().tolist()


coords = st.floats(min_value=-8, max_value=72, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    h=st.integers(1, 64),
    w=st.integers(1, 64),
    points=st.lists(st.tuples(coords, coords), min_size=3, max_size=12),
    integer=st.booleans(),
)
def test_polygon_matches_pycocotools(
    h: int, w: int, points: list[tuple[float, float]], integer: bool
) -> None:
    xy = np.asarray(points, dtype=np.float64)
    if integer:  # pixel-aligned vertices hit the boundary cases of the tracer
        xy = np.round(xy)
    poly = xy.ravel().tolist()
    assert np.array_equal(polygon_to_mask(poly, h, w), _pycoco_poly([poly], h, w))


def test_polygon_edge_cases_match_pycocotools() -> None:
    rng = np.random.default_rng(7)
    cases = [
        [10.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 20.0, 5.0, 25.0],  # repeated vertices
        [0.0, 0.0, 49.0, 0.0, 49.0, 29.0, 0.0, 29.0],  # the full frame
        [-5.0, -5.0, 60.0, -5.0, 60.0, 40.0],  # beyond the image
        [3.5, 3.5, 3.5, 20.5, 3.5, 3.5],  # a zero-area sliver
    ]
    cases += [_star(rng, 30, 50, int(rng.integers(3, 40))) for _ in range(50)]
    for poly in cases:
        assert np.array_equal(polygon_to_mask(poly, 30, 50), _pycoco_poly([poly], 30, 50)), poly


def test_multi_polygon_is_union() -> None:
    rng = np.random.default_rng(3)
    polys = [_star(rng, 40, 60, 8) for _ in range(3)]
    ref = _pycoco_poly(polys, 40, 60)
    assert np.array_equal(segmentation_to_mask(polys, 40, 60, backend="numpy"), ref)
    assert np.array_equal(segmentation_to_mask(polys, 40, 60, backend="pycocotools"), ref)


def _random_mask(seed: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    blocks = rng.random((h // 4 + 1, w // 4 + 1)) < 0.4
    return np.kron(blocks, np.ones((4, 4), dtype=bool))[:h, :w].astype(np.uint8)


@pytest.mark.parametrize("seed", range(5))
def test_compressed_rle_matches_pycocotools(seed: int) -> None:
    mask = _random_mask(seed, 37, 53)
    rle = coco_mask.encode(np.asfortranarray(mask))
    counts = rle_from_string(rle["counts"])
    assert np.array_equal(decode_rle(counts, 37, 53), mask)
    assert rle_to_string(counts) == rle["counts"].decode()
    as_str = {"size": rle["size"], "counts": rle["counts"].decode()}
    for backend in ("numpy", "pycocotools"):
        assert np.array_equal(segmentation_to_mask(as_str, 37, 53, backend=backend), mask)
        assert np.array_equal(segmentation_to_mask(dict(rle), 37, 53, backend=backend), mask)


def _uncompressed(mask: np.ndarray) -> dict[str, object]:
    flat = mask.T.ravel()  # column-major, like COCO
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat[0] == 1:
        runs = [0, *runs]
    return {"size": list(mask.shape), "counts": runs}


@pytest.mark.parametrize("seed", range(5))
def test_uncompressed_crowd_rle_matches_pycocotools(seed: int) -> None:
    mask = _random_mask(seed, 48, 64)
    if seed == 0:
        mask[0, 0] = 1  # starts with a run of ones: counts begin with 0
    segm = _uncompressed(mask)
    ref = np.asarray(coco_mask.decode(coco_mask.frPyObjects(segm, 48, 64)))
    assert np.array_equal(ref, mask)
    for backend in ("numpy", "pycocotools"):
        assert np.array_equal(segmentation_to_mask(segm, 48, 64, backend=backend), mask)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=40))
def test_rle_string_round_trip(counts: list[int]) -> None:
    assert rle_from_string(rle_to_string(counts)).tolist() == counts


@pytest.mark.parametrize("backend", ["numpy", "pycocotools"])
def test_bad_rle_is_a_decode_error_not_an_overrun(backend: str) -> None:
    with pytest.raises(DecodeError, match="cover"):
        segmentation_to_mask({"size": [4, 4], "counts": [3, 100]}, 4, 4, backend=backend)
    with pytest.raises(DecodeError, match="cover"):
        segmentation_to_mask({"size": [4, 4], "counts": "P1"}, 4, 4, backend=backend)
    with pytest.raises(DecodeError, match="size"):
        segmentation_to_mask({"size": [5, 4], "counts": [20]}, 4, 4, backend=backend)
    with pytest.raises(DecodeError, match="invalid character"):
        segmentation_to_mask({"size": [4, 4], "counts": "\x01\x02"}, 4, 4, backend=backend)
    with pytest.raises(DecodeError, match="polygons"):
        segmentation_to_mask(42, 4, 4, backend=backend)
    with pytest.raises(DecodeError):
        segmentation_to_mask([[1.0, 2.0, float("nan"), 3.0, 4.0, 5.0]], 4, 4, backend="numpy")


def test_degenerate_polygons_give_empty_masks() -> None:
    for backend in ("numpy", "pycocotools"):
        assert segmentation_to_mask([], 5, 6, backend=backend).shape == (5, 6)
        assert not segmentation_to_mask([[1.0, 1.0, 3.0, 3.0]], 5, 6, backend=backend).any()


def test_unknown_backend() -> None:
    with pytest.raises(ConfigError):
        segmentation_to_mask([], 4, 4, backend="opencv")
