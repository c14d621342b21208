"""Batching samples: a shape check that explains what torch's default collate cannot.

torch's ``default_collate`` stacks the tensors found at the same place of every
sample. Images decoded with ``size=<int>`` keep their aspect ratio, so their shapes
differ, and the stack fails with ``stack expects each tensor to be equal size`` in
the main process or ``Trying to resize storage that is not resizable`` in a
worker, neither of which says why. :func:`check_same_shapes` finds the field
first and names it, the shapes, and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastload.errors import ConfigError

__all__ = ["check_same_shapes", "default_collate"]


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, (str, bytes)):
        return None
    try:
        return tuple(int(d) for d in shape)
    except TypeError:  # something with a non-sequence 'shape' attribute
        return None


def _key(sample: Any) -> str:
    if isinstance(sample, Mapping) and "__key__" in sample:
        return f"sample {sample['__key__']!r}"
    return "a sample"


def _check(values: Sequence[Any], samples: Sequence[Any], where: str) -> None:
    first = values[0]
    if isinstance(first, Mapping):
        for name in first:
            if all(isinstance(v, Mapping) and name in v for v in values):
                _check([v[name] for v in values], samples, f"{where}[{name!r}]")
        return
    if isinstance(first, (tuple, list)):
        if all(isinstance(v, (tuple, list)) and len(v) == len(first) for v in values):
            for k in range(len(first)):
                _check([v[k] for v in values], samples, f"{where}[{k}]")
        return
    shape = _shape(first)
    if shape is None:
        return
    for j, value in enumerate(values[1:], start=1):
        other = _shape(value)
        if other is not None and other != shape:
            raise ConfigError(
                f"cannot batch {where or 'the samples'}: {_key(samples[0])} has shape "
                f"{shape} but {_key(samples[j])} (item {j} of the batch) has {other}; "
                "images decoded with size=<int> keep their aspect ratio. Decode to one "
                "exact size with size=(height, width), resize in transform=, or pass a "
                "collate_fn that pads or keeps a list"
            )


def check_same_shapes(samples: Sequence[Any]) -> None:
    """Check that the arrays and tensors at each place of ``samples`` (fields of a
    dict, items of a tuple, nested) have one shape, as ``default_collate`` needs.

    Returns ``None``; raises :class:`ConfigError` naming the field, the two shapes,
    the samples and the fix (``size=(height, width)`` or a ``collate_fn``).
    """
    if len(samples) > 1:
        _check(list(samples), samples, "")


def default_collate(samples: Sequence[Any]) -> Any:
    """torch's ``default_collate`` after :func:`check_same_shapes`: the same batch, or
    a :class:`ConfigError` that says which field differs in shape, and how to fix it."""
    import torch.utils.data

    check_same_shapes(samples)
    return torch.utils.data.default_collate(list(samples))
