"""Fixtures of the decode tests."""

from __future__ import annotations

import pytest

from .images import encode, photo_like


@pytest.fixture(scope="session")
def jpeg_640() -> bytes:
    """A 640x480 quality-90 JPEG of photo-like content."""
    return encode(photo_like(), "JPEG", quality=90)
