"""Bad bytes never crash the decoders: they give a result or a DecodeError naming the sample."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload.decode import Decoder, decode_image, decode_label
from fastload.errors import DecodeError

from .images import encode, photo_like

_JPEG = encode(photo_like(48, 32, seed=0), "JPEG", quality=90)
_PNG = encode(photo_like(24, 16, seed=1), "PNG")
_NAME = "000007.jpg"


def _outcome(call: Callable[[], Any]) -> Any:
    """The result of ``call()``, or the DecodeError it raised (anything else fails)."""
    try:
        return call()
    except DecodeError as e:
        return e


def _check(data: bytes) -> None:
    with warnings.catch_warnings():
        # A mutated header may declare a big image: Pillow warns, we refuse.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        for call in (
            lambda: decode_image(data, name=_NAME),
            lambda: decode_image(data, size=16, name=_NAME),
            lambda: decode_label(data, size=(8, 8), resize="exact", name=_NAME),
        ):
            outcome = _outcome(call)
            if isinstance(outcome, DecodeError):
                assert _NAME in str(outcome)
            else:
                assert outcome.width > 0
                assert outcome.height > 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_random_bytes(data: bytes) -> None:
    _check(data)


def _mutate(base: bytes, cuts: list[tuple[int, int]], truncate: int | None) -> bytes:
    data = bytearray(base)
    for pos, value in cuts:
        data[pos % len(data)] = value
    if truncate is not None:
        data = data[: truncate % (len(data) + 1)]
    return bytes(data)


mutations = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from([_JPEG, _PNG]),
    cuts=mutations,
    truncate=st.none() | st.integers(0, 10**6),
)
def test_mutated_images(base: bytes, cuts: list[tuple[int, int]], truncate: int | None) -> None:
    _check(_mutate(base, cuts, truncate))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=512), st.sampled_from(["jpg", "png", "json", "cls", "txt", "seg.png"]))
def test_decoder_on_random_fields(data: bytes, field: str) -> None:
    outcome = _outcome(lambda: Decoder(size=16)({"__key__": "000007", field: data}))
    if isinstance(outcome, DecodeError):
        assert f"000007.{field}" in str(outcome)
    else:
        assert outcome["__key__"] == "000007"


@pytest.mark.parametrize("cut", [0, 1, 2, 10, 100, len(_JPEG) // 2, len(_JPEG) - 2])
def test_every_truncation_of_a_jpeg(cut: int) -> None:
    with pytest.raises(DecodeError, match=r"000007\.jpg"):
        decode_image(_JPEG[:cut], name=_NAME)
