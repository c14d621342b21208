"""``PackedBytes``: a batch of variable-length byte strings as one contiguous buffer.

This is how raw (undecoded) fields leave :class:`fastload.DataLoader`: for a batch
of ``n`` samples, field ``f`` is one ``uint8`` tensor holding every sample's bytes
back to back, plus ``n + 1`` offsets. One object per field means one pinned buffer,
one host-to-device copy, and a buffer that nvJPEG (``torchvision.io.decode_jpeg``)
or DALI can take whole.

* ``len(p)`` is the batch size; ``p[i]`` is sample ``i``'s bytes: a ``numpy.uint8``
  view while the data is on the CPU (so ``bytes(p[i])`` is fast and zero-copy
  until then), a ``torch.uint8`` view on any other device.
* ``p.data`` (``torch.uint8[total]``) and ``p.offsets`` (``torch.int64[n + 1]``, on
  the CPU always) are the two parts; ``p.sizes`` the per-sample lengths.
* ``p.to(device)``, ``p.pin_memory()`` move or pin the data (torch's pin thread
  calls ``pin_memory()`` on objects that have it).

A sample that lacks the field has length 0 and is listed in ``p.missing``.

This module imports torch only when a method needs it, so ``import fastload``
stays free of torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["PackedBytes"]


class PackedBytes:
    """A packed batch of byte strings: ``data`` (uint8 tensor) and ``offsets``
    (int64 tensor of ``len + 1`` entries, starting at 0). See the module docstring."""

    __slots__ = ("_cpu_view", "data", "missing", "offsets")

    def __init__(self, data: Any, offsets: Any, missing: Sequence[int] = ()) -> None:
        import torch

        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
            raise TypeError("PackedBytes.data must be a 1-D torch.uint8 tensor")
        if not isinstance(offsets, torch.Tensor) or offsets.ndim != 1 or offsets.numel() < 1:
            raise TypeError("PackedBytes.offsets must be a 1-D tensor of len + 1 entries")
        self.data = data
        self.offsets = offsets.to(dtype=torch.int64, device="cpu")
        self.missing = tuple(int(i) for i in missing)
        self._cpu_view: Any = None

    @classmethod
    def from_list(cls, items: Sequence[bytes | bytearray | memoryview | None]) -> PackedBytes:
        """Pack ``items`` (None: a missing value) into one buffer (one copy each)."""
        import numpy as np
        import torch

        sizes = np.fromiter(
            (0 if b is None else memoryview(b).nbytes for b in items), np.int64, len(items)
        )
        offsets = np.zeros(len(items) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
        out = data.numpy()
        for i, b in enumerate(items):
            if b is not None and sizes[i]:
                out[offsets[i] : offsets[i + 1]] = np.frombuffer(b, np.uint8)
        missing = [i for i, b in enumerate(items) if b is None]
        return cls(data, torch.from_numpy(offsets), missing)

    # ---------------------------------------------------------------- access
    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def sizes(self) -> Any:
        """Per-sample byte counts (``torch.int64[len]``)."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def nbytes(self) -> int:
        """Total payload bytes."""
        return int(self.data.numel())

    @property
    def device(self) -> Any:
        """Where ``data`` lives."""
        return self.data.device

    def _span(self, i: int) -> tuple[int, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"PackedBytes index {i} out of range for {n} items")
        lo, hi = self.offsets[i : i + 2].tolist()
        return int(lo), int(hi)

    def __getitem__(self, i: int) -> Any:
        lo, hi = self._span(int(i))
        if self.data.device.type == "cpu":
            if self._cpu_view is None:
                self._cpu_view = self.data.numpy()
            return self._cpu_view[lo:hi]
        return self.data[lo:hi]

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def tolist(self) -> list[bytes]:
        """Every item as ``bytes`` (copies; moves the data to the CPU first)."""
        cpu = self.data.cpu().numpy()
        offs = self.offsets.tolist()
        return [cpu[offs[i] : offs[i + 1]].tobytes() for i in range(len(self))]

    def tensors(self) -> list[Any]:
        """Every item as a ``torch.uint8`` view of ``data`` (what
        ``torchvision.io.decode_jpeg`` takes as a list), on ``data``'s device."""
        offs = self.offsets.tolist()
        return [self.data[offs[i] : offs[i + 1]] for i in range(len(self))]

    # ------------------------------------------------------------- movement
    def to(self, device: Any, non_blocking: bool = False) -> PackedBytes:
        """A copy of the data on ``device`` (offsets stay on the CPU)."""
        return PackedBytes(
            self.data.to(device, non_blocking=non_blocking), self.offsets, self.missing
        )

    def pin_memory(self, device: Any = None) -> PackedBytes:
        """The same bytes in pinned host memory."""
        data = self.data.pin_memory() if device is None else self.data.pin_memory(device)
        return PackedBytes(data, self.offsets, self.missing)

    def is_pinned(self) -> bool:
        """Whether ``data`` is in pinned host memory."""
        return bool(self.data.is_pinned())

    def map_data(self, fn: Any) -> PackedBytes:
        """A PackedBytes whose data is ``fn(data)`` (used by the device feeder)."""
        return PackedBytes(fn(self.data), self.offsets, self.missing)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedBytes):
            return NotImplemented
        import torch

        return (
            len(self) == len(other)
            and bool(torch.equal(self.offsets, other.offsets))
            and bool(torch.equal(self.data.cpu(), other.data.cpu()))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedBytes(items={len(self)}, bytes={self.nbytes}, device={self.data.device})"

    def __reduce__(self) -> Any:
        return (PackedBytes, (self.data, self.offsets, self.missing))
