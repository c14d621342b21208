"""Crops chosen before decoding: a sample decoder that reads each image's size from
its header, draws the crop (random-resized, a random patch, or fixed), and decodes
only that region (:func:`~fastload.decode.decode_crop`); label images (masks) of the
sample are cut with the same box and resized with NEAREST.

Use it as a dataset's ``decode=``::

    ShardedDataset(url, decode=CropDecoder(RandomResizedCrop(), size=(224, 224)))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from fastload.decode.crop import crop_decoder, cut_pixels, decode_crop, image_size
from fastload.decode.decoder import LABEL_SUFFIXES, Decoder
from fastload.decode.labels import decode_label, label_to_numpy, label_to_tensor
from fastload.errors import ConfigError, DecodeError

__all__ = ["CropDecoder", "FixedCrop", "RandomPatch", "RandomResizedCrop", "Tiles"]

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop.get_params``: an area fraction drawn from
    ``scale`` and a log-uniform aspect ratio from ``ratio``, up to 10 attempts, then
    the central crop that fits ``ratio`` (the same fallback)."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)

    def __post_init__(self) -> None:
        if not (0 < self.scale[0] <= self.scale[1]) or not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(
                f"RandomResizedCrop needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= "
                f"ratio[1], got scale={self.scale}, ratio={self.ratio}"
            )

    def box(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The ``(left, top, width, height)`` crop of a ``width`` x ``height`` image."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return left, top, w, h
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h


@dataclass(frozen=True)
class RandomPatch:
    """A ``width`` x ``height`` patch at a uniform position (the whole image where
    it is smaller): the U-Net case, a large image served as random tiles."""

    width: int
    height: int

    def box(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The patch's ``(left, top, width, height)`` in a ``width`` x ``height`` image."""
        w, h = min(self.width, width), min(self.height, height)
        return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h


@dataclass(frozen=True)
class FixedCrop:
    """The same ``(left, top, width, height)`` of every image (a tile, a border
    trimmed); an image it does not fit is a ``ConfigError`` naming both."""

    left: int
    top: int
    width: int
    height: int

    def box(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The fixed box (checked against the image by :func:`decode_crop`)."""
        return self.left, self.top, self.width, self.height


def _starts(length: int, tile: int, stride: int) -> list[int]:
    """Where the tiles of one axis start: every ``stride`` pixels, the last one moved
    back to end at the border (so every tile has the same size and the tiles cover
    the axis); one tile, the whole axis, where it is shorter than ``tile``."""
    if length <= tile:
        return [0]
    n = -(-(length - tile) // stride) + 1
    return [min(k * stride, length - tile) for k in range(n)]


@dataclass(frozen=True)
class Tiles:
    """Every ``width`` x ``height`` tile of each image, each served as its own sample
    (the U-Net case: a 4K image as its tiles). Tiles start every ``stride_x``/
    ``stride_y`` pixels (default: the tile's size, no overlap); the last column and
    row are moved back to end at the image's border, so every tile has the same size
    and together they cover the image (overlapping at the far edges when the size is
    not a multiple of the stride); an image smaller than a tile is one tile of its
    own size on that axis. Tiles are numbered row by row (:meth:`grid`).

    As a :class:`CropDecoder`'s crop, the datasets serve the tiles of sample ``key``
    as samples keyed ``"<key>/<row>_<col>"``, and count tiles in their length (see
    docs/howto-crops.md). Raises :class:`ConfigError` for sizes or strides below 1.
    """

    width: int
    height: int
    stride_x: int | None = None
    stride_y: int | None = None

    def __post_init__(self) -> None:
        values = (self.width, self.height, self.stride_x or 1, self.stride_y or 1)
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ConfigError(
                f"Tiles needs positive int sizes and strides, got width={self.width!r}, "
                f"height={self.height!r}, stride_x={self.stride_x!r}, stride_y={self.stride_y!r}"
            )

    def grid(self, width: int, height: int) -> list[tuple[int, int, Box]]:
        """``(row, col, (left, top, width, height))`` of every tile of a ``width`` x
        ``height`` image, row by row."""
        xs = _starts(width, self.width, self.stride_x or self.width)
        ys = _starts(height, self.height, self.stride_y or self.height)
        w, h = min(self.width, width), min(self.height, height)
        return [(r, c, (x, y, w, h)) for r, y in enumerate(ys) for c, x in enumerate(xs)]

    def count(self, width: int, height: int) -> int:
        """How many tiles a ``width`` x ``height`` image has."""
        return len(_starts(width, self.width, self.stride_x or self.width)) * len(
            _starts(height, self.height, self.stride_y or self.height)
        )

    def box(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The first tile (a tile is chosen by number: :meth:`CropDecoder.tile`)."""
        return self.grid(width, height)[0][2]


@dataclass(frozen=True)
class CropDecoder:
    """Decode a sample's images as a crop chosen from the header, before decoding.

    ``crop``: :class:`RandomResizedCrop`, :class:`RandomPatch`, :class:`FixedCrop` or
    :class:`Tiles` (every tile its own sample: :meth:`tile`, :meth:`count_tiles`);
    ``size``: the output ``(height, width)`` (the crop decodes at the smallest DCT
    scale that covers it), ``None`` to keep the crop's size; ``image``: ``"numpy"``
    (HWC uint8) or ``"tensor"`` (``layout``); ``decoder``: as in :func:`decode_crop`.
    The draw is deterministic in ``(seed, epoch, sample key)``: the same sample gets
    the same crop in a rerun, another one in the next epoch (:meth:`set_epoch`).
    Label images (:data:`~fastload.decode.LABEL_SUFFIXES`) are cut with the sample's
    first image's box, resized with NEAREST; ``"__crop__"`` holds that box
    ``(left, top, width, height)`` in original pixels, to cut boxes or targets the
    same way. JSON, ``cls`` and ``txt`` fields are parsed as by
    :class:`~fastload.decode.Decoder`. Raises :class:`ConfigError` for bad settings.
    """

    crop: RandomResizedCrop | RandomPatch | FixedCrop | Tiles = field(
        default_factory=RandomResizedCrop
    )
    size: tuple[int, int] | None = None
    image: str = "tensor"
    layout: str = "CHW"
    mode: str = "RGB"
    resample: str = "bilinear"
    decoder: str = "auto"
    seed: int = 0
    epoch: int = 0
    label_suffixes: tuple[str, ...] = LABEL_SUFFIXES

    def __post_init__(self) -> None:
        if not isinstance(self.crop, (RandomResizedCrop, RandomPatch, FixedCrop, Tiles)):
            raise ConfigError(
                f"CropDecoder.crop must be RandomResizedCrop, RandomPatch, FixedCrop or Tiles, "
                f"got {self.crop!r}"
            )
        if self.image not in ("numpy", "tensor"):
            raise ConfigError(f"CropDecoder.image must be 'numpy' or 'tensor', got {self.image!r}")
        if self.layout not in ("CHW", "HWC"):
            raise ConfigError(f"CropDecoder.layout must be 'CHW' or 'HWC', got {self.layout!r}")
        if self.size is not None:
            object.__setattr__(self, "size", tuple(self.size))
        crop_decoder(self.decoder)
        object.__setattr__(self, "label_suffixes", tuple(s.lower() for s in self.label_suffixes))
        object.__setattr__(self, "_fields", Decoder(image=None, label_suffixes=self.label_suffixes))

    def set_epoch(self, epoch: int) -> None:
        """Draw the crops of epoch ``epoch`` (before the DataLoader starts its workers,
        which take a copy of the decoder)."""
        object.__setattr__(self, "epoch", int(epoch))

    def rng(self, key: str) -> np.random.Generator:
        """The generator of sample ``key``'s draw in this epoch."""
        return np.random.default_rng(
            [self.seed, self.epoch, xxhash.xxh64_intdigest(key.encode("utf-8", "surrogatepass"))]
        )

    @property
    def tiled(self) -> bool:
        """Whether each tile is its own sample (``crop`` is :class:`Tiles`)."""
        return isinstance(self.crop, Tiles)

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """Decode ``sample`` (``{"__key__": str, field: bytes, ...}``); raises
        :class:`~fastload.errors.DecodeError` naming the sample and field, and
        :class:`ConfigError` for :class:`Tiles` (a sample is several: :meth:`tile`)."""
        if self.tiled:
            raise ConfigError(
                "CropDecoder(Tiles(...)) makes several samples of one: use it as decode= "
                "of ShardedDataset/StreamingDataset (which count tiles), or decoder.tile("
                "sample, t)"
            )
        rng = self.rng(str(sample.get("__key__", "?")))
        return self._decode(sample, lambda width, height: self.crop.box(width, height, rng))

    def stored(self) -> Decoder:
        """The :class:`Decoder` whose output the pixel tier (``pixel_cache=``) stores for
        this crop decoder: each image whole, in ``mode``, at full size (bounded by
        ``PixelCache(max_side=...)``), before any crop; :meth:`from_pixels` cuts each
        epoch's crop from it. Raises :class:`ConfigError` for :class:`Tiles`: a tile is
        a region at the original resolution, which pixels bounded by ``max_side`` do
        not hold, and a 4K image stored at full size costs ~48 MB of cache per image
        where the region decode already decodes each tile's pixels once."""
        if self.tiled:
            raise ConfigError(
                "pixel_cache does not combine with CropDecoder(Tiles(...)): a tile is a "
                "region at the image's original resolution, which pixels stored at "
                "PixelCache(max_side=...) do not hold, and storing very large images at "
                "full size costs their decoded size (48 MB for 4096x4096 RGB) per image; "
                "the region decode already decodes only each tile's pixels. Drop "
                "pixel_cache for tiles, or use RandomPatch/RandomResizedCrop with it"
            )
        return Decoder(
            image="numpy",
            mode=self.mode,
            resample=self.resample,
            label_suffixes=self.label_suffixes,
        )

    def from_pixels(
        self,
        key: str,
        fields: Iterable[tuple[str, Any]],
        images: Mapping[str, tuple[np.ndarray, tuple[int, int]]],
    ) -> dict[str, Any]:
        """Sample ``key`` as :meth:`__call__` makes it, with each image's crop cut from
        its stored pixels instead of decoded: ``fields`` are ``(name, raw bytes)`` of
        every field in the sample's order (images with None), ``images`` maps each image
        field to ``(pixels, original (width, height))`` as :meth:`stored` decodes it.

        The box is drawn as :meth:`__call__` draws it (``(seed, epoch, key)``, from the
        first image's original size; ``"__crop__"`` is that box in original pixels),
        then :func:`~fastload.decode.crop.cut_pixels` scales it to the stored pixels and
        resizes it to ``size``; label images are decoded and cut with the box exactly
        as :meth:`__call__` cuts them. Raises :class:`ConfigError` for a box outside an
        image, :class:`DecodeError` for a label image that does not decode or is
        smaller than the box."""
        pairs = list(fields)
        dec: Decoder = object.__getattribute__(self, "_fields")
        parsed = dec({"__key__": key, **{n: v for n, v in pairs if n not in images}})
        rng = self.rng(key)
        box: Box | None = None
        out: dict[str, Any] = {"__key__": key}
        for name, _ in pairs:
            if name not in images:
                out[name] = parsed[name]
                continue
            arr, original = images[name]
            if box is None:
                box = self.crop.box(int(original[0]), int(original[1]), rng)
            cut = cut_pixels(
                arr, original, box, size=self.size, resample=self.resample, name=f"{key}.{name}"
            )
            out[name] = self._image_output(cut)
        if box is not None:
            for name, value in pairs:
                if name not in images and dec.kind(name) == "label":
                    out[name] = self._label(value, box, f"{key}.{name}")
            out["__crop__"] = box
        return out

    def count_tiles(self, sample: Mapping[str, Any]) -> int:
        """How many tiles ``sample``'s first image has (from its header). Raises
        :class:`DecodeError` for a sample without an image, :class:`ConfigError`
        unless ``crop`` is :class:`Tiles`."""
        tiles = self._tiles()
        data, label = self._first_image(sample)
        width, height = image_size(data, name=label)
        return tiles.count(width, height)

    def tile(self, sample: Mapping[str, Any], t: int) -> dict[str, Any]:
        """Tile ``t`` (row by row) of ``sample``: its images and label images cut to
        the tile, keyed ``"<key>/<row>_<col>"``, ``"__crop__"`` the tile's box.
        Raises :class:`DecodeError` for a tile number the image does not have."""
        tiles = self._tiles()
        key = str(sample.get("__key__", "?"))
        data, label = self._first_image(sample)
        width, height = image_size(data, name=label)
        grid = tiles.grid(width, height)
        if not 0 <= t < len(grid):
            raise DecodeError(
                f"sample {key!r}: its {width}x{height} image has {len(grid)} tiles, not a "
                f"tile {t} (did the shard change since the dataset counted its tiles?)"
            )
        row, col, box = grid[t]
        out = self._decode(sample, lambda w, h: box)
        out["__key__"] = f"{key}/{row}_{col}"
        return out

    def _tiles(self) -> Tiles:
        if not isinstance(self.crop, Tiles):
            raise ConfigError(f"CropDecoder.crop is {self.crop!r}, not Tiles")
        return self.crop

    def _first_image(self, sample: Mapping[str, Any]) -> tuple[Any, str]:
        fields: Decoder = object.__getattribute__(self, "_fields")
        key = str(sample.get("__key__", "?"))
        for name, value in sample.items():
            if not name.startswith("__") and fields.kind(name) == "image":
                return value, f"{key}.{name}"
        raise DecodeError(f"sample {key!r} has no image field to cut into tiles")

    def _decode(self, sample: Mapping[str, Any], box_for: Any) -> dict[str, Any]:
        fields: Decoder = object.__getattribute__(self, "_fields")
        key = str(sample.get("__key__", "?"))
        out = fields(sample)
        box: Box | None = None
        for name, value in sample.items():
            if name.startswith("__") or fields.kind(name) != "image":
                continue
            label = f"{key}.{name}"
            if box is None:
                width, height = image_size(value, name=label)
                box = box_for(width, height)
            arr = decode_crop(
                value,
                box,
                size=self.size,
                mode=self.mode,
                resample=self.resample,
                decoder=self.decoder,
                name=label,
            )
            out[name] = self._image_output(arr)
        for name, value in sample.items():
            if name.startswith("__") or fields.kind(name) != "label" or box is None:
                continue
            out[name] = self._label(value, box, f"{key}.{name}")
        if box is not None:
            out["__crop__"] = box
        return out

    def _image_output(self, arr: np.ndarray) -> Any:
        if self.image == "numpy":
            return arr
        import torch

        tensor = torch.from_numpy(arr)
        return tensor.permute(2, 0, 1) if self.layout == "CHW" else tensor

    def _label(self, value: Any, box: Box, label: str) -> Any:
        img = decode_label(value, name=label)
        if img.size[0] < box[0] + box[2] or img.size[1] < box[1] + box[3]:
            raise DecodeError(
                f"cannot decode {label!r}: the label image of {img.size[0]}x{img.size[1]} "
                "is smaller than the crop "
                f"{box} of its image"
            )
        left, top, w, h = box
        img = img.crop((left, top, left + w, top + h))
        if self.size is not None and (h, w) != self.size:
            img = img.resize((self.size[1], self.size[0]), 0)  # NEAREST
        return label_to_numpy(img) if self.image == "numpy" else label_to_tensor(img)
