"""Decode and transform options shared by the datasets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import ConfigError

__all__ = ["EpochCell", "NvjpegDecode", "SampleFn", "finish", "forward_epoch", "make_decoder"]

SampleFn = Callable[[dict[str, Any]], Any]


def make_decoder(decode: Any, size: Any) -> SampleFn | None:
    """Resolve a dataset's ``decode=`` argument.

    ``None`` keeps raw bytes; ``"pil"``, ``"numpy"`` or ``"tensor"`` decode images
    (and JSON, ``cls``, label PNGs) with :class:`fastload.decode.Decoder` at ``size``;
    ``"nvjpeg"`` decodes JPEGs batch by batch on the GPU (:class:`NvjpegDecode`);
    a ``Decoder`` or any callable taking the sample dict is used as it is.
    Raises :class:`ConfigError` on anything else.
    """
    if decode is None:
        if size is not None:
            raise ConfigError("size= needs decode= ('pil', 'numpy', 'tensor' or a Decoder)")
        return None
    if decode == "nvjpeg":
        resize = "exact" if isinstance(size, (tuple, list)) else "shorter"
        return NvjpegDecode(size=tuple(size) if isinstance(size, list) else size, resize=resize)
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
        f"decode= must be None, 'pil', 'numpy', 'tensor', 'nvjpeg' or a callable, got {decode!r}"
    )


def forward_epoch(decoder: Any, epoch: int) -> None:
    """Pass ``epoch`` on to ``decoder.set_epoch`` where the decoder has one (a
    :class:`~fastload.decode.CropDecoder`: its draws are per epoch)."""
    set_epoch = getattr(decoder, "set_epoch", None)
    if callable(set_epoch) and getattr(decoder, "epoch", None) != epoch:
        set_epoch(epoch)


class EpochCell:
    """An epoch number in shared memory (a torch tensor), made before a DataLoader
    starts its workers: ``set`` in the main process is what ``get`` reads in every
    worker, persistent ones included (fork or spawn), so a map-style dataset's
    ``set_epoch`` reaches the copies the workers hold."""

    def __init__(self, epoch: int = 0) -> None:
        import torch

        self._cell = torch.full((1,), int(epoch), dtype=torch.int64).share_memory_()

    def set(self, epoch: int) -> None:
        """Set the epoch every process holding this cell reads."""
        self._cell[0] = int(epoch)

    def get(self) -> int:
        """The epoch last set in any process."""
        return int(self._cell[0])


def finish(sample: Any, decoder: SampleFn | None, transform: Callable[[Any], Any] | None) -> Any:
    """Apply a dataset's decoder, then its transform, to a raw sample."""
    if decoder is not None:
        sample = decoder(sample)
    if transform is not None:
        sample = transform(sample)
    return sample


@dataclass(frozen=True)
class NvjpegDecode:
    """``decode="nvjpeg"``: JPEG fields decoded per batch on the GPU.

    Through :class:`fastload.DataLoader` (the cache transport) the batch's raw JPEG
    bytes are packed into pinned host memory and decoded in one
    ``torchvision.io.decode_jpeg`` call per field on the loader's CUDA device
    (:class:`fastload.decode.gpu.NvjpegDecoder`; the CPU with no device), resized there
    to ``size``. Per sample (``ds[i]``, or under torch's own DataLoader) the same
    outputs come from the CPU decoder (:class:`fastload.decode.Decoder` with
    ``image="tensor"``), so the dataset works everywhere.
    """

    size: Any = None
    resize: str = "shorter"
    _cpu: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        from fastload.decode import Decoder

        object.__setattr__(
            self, "_cpu", Decoder(image="tensor", size=self.size, resize=self.resize)
        )

    def __call__(self, sample: dict[str, Any]) -> Any:
        return self._cpu(sample)

    def batch_decoder(self, device: Any) -> Any:
        """The batch decoder for ``device`` (``None``: the CPU)."""
        from fastload.decode.gpu import NvjpegDecoder

        return NvjpegDecoder(
            size=self.size, resize=self.resize, device="cpu" if device is None else device
        )
