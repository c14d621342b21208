"""Decode and transform options shared by the datasets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload.errors import ConfigError

__all__ = ["SampleFn", "finish", "make_decoder"]

SampleFn = Callable[[dict[str, Any]], Any]


def make_decoder(decode: Any, size: Any) -> SampleFn | None:
    """Resolve a dataset's ``decode=`` argument.

    ``None`` keeps raw bytes; ``"pil"``, ``"numpy"`` or ``"tensor"`` decode images
    (and JSON, ``cls``, label PNGs) with :class:`fastload.decode.Decoder` at ``size``;
    a ``Decoder`` or any callable taking the sample dict is used as it is.
    Raises :class:`ConfigError` on anything else.
    """
    if decode is None:
        if size is not None:
            raise ConfigError("size= needs decode= ('pil', 'numpy', 'tensor' or a Decoder)")
        return None
    if isinstance(decode, str):
        from fastload.decode import Decoder

        # an int is the shorter side (aspect kept); (height, width) is the exact size
        resize = "exact" if isinstance(size, (tuple, list)) else "shorter"
        return Decoder(image=decode, size=size, resize=resize)
    if callable(decode):
        if size is not None:
            raise ConfigError(
                "size= applies to decode='pil'|'numpy'|'tensor'; set it on the Decoder"
            )
        return decode
    raise ConfigError(
        f"decode= must be None, 'pil', 'numpy', 'tensor' or a callable, got {decode!r}"
    )


def finish(sample: Any, decoder: SampleFn | None, transform: Callable[[Any], Any] | None) -> Any:
    """Apply a dataset's decoder, then its transform, to a raw sample."""
    if decoder is not None:
        sample = decoder(sample)
    if transform is not None:
        sample = transform(sample)
    return sample
