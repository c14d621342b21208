"""``fastload.Cityscapes``: torchvision's ``Cityscapes`` over fastload shards.

The Cityscapes tables (label classes, splits, modes, target fields) live in
:mod:`fastload.decode.cityscapes`, which the converter imports too; they are
re-exported here. Where torchvision imports, ``Cityscapes`` is a subclass of
torchvision's (:mod:`fastload.datasets.vision`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.coco import as_bytes, open_converted, pixel_tier, rgb_image
from fastload.datasets.options import EpochCell, forward_epoch
from fastload.datasets.pixels import PixelTier
from fastload.datasets.source import BuiltItems
from fastload.datasets.vision import CityscapesBase, init_vision
from fastload.decode.cityscapes import (
    CITYSCAPES_CLASSES,
    CITYSCAPES_MODES,
    CITYSCAPES_SPLITS,
    IMAGE_FIELD,
    TARGET_SUFFIXES,
    TARGET_TYPES,
    CityscapesClass,
    target_fields,
    validate_split_mode,
)
from fastload.decode.cityscapes import one_of as _one_of
from fastload.decode.crop import decode_crop, image_size
from fastload.decode.crop_sample import CropDecoder, FixedCrop, RandomPatch
from fastload.decode.image import open_image
from fastload.decode.pixels import PixelCache
from fastload.errors import ConfigError, ShardFormatError

__all__ = [
    "CITYSCAPES_CLASSES",
    "CITYSCAPES_MODES",
    "CITYSCAPES_SPLITS",
    "IMAGE_FIELD",
    "TARGET_SUFFIXES",
    "TARGET_TYPES",
    "Cityscapes",
    "CityscapesClass",
    "target_fields",
    "validate_split_mode",
]


class Cityscapes(BuiltItems, CityscapesBase):
    """Cityscapes samples from a dataset written by ``fastload.convert.cityscapes``.

    ``ds[i]`` is ``(image, target)`` as torchvision's ``Cityscapes`` gives it: the
    camera image ``.convert("RGB")``, and for each ``target_type`` the label-id
    (``"semantic"``), instance-id (``"instance"``) or colour (``"color"``) PIL image
    as stored, or the polygon dict (``"polygon"``); a tuple when several types are
    asked for. Samples are in the converter's canonical order (cities, then file
    names, sorted). ``split`` and ``mode`` must be those the dataset was converted
    with; ``cache_dir``, ``cache_limit``, ``ram_limit``, ``storage_options``,
    ``cache_config`` and ``fetch`` go to :class:`fastload.ShardedDataset`. Everything
    after ``url`` is keyword-only (``split``, ``mode`` and ``target_type`` by position,
    as torchvision takes them, still work for one release, with a DeprecationWarning).
    ``pixel_cache``: ``True`` or a :class:`~fastload.PixelCache` keeps each camera
    image's decoded RGB pixels in the node's disk tier (``cache_dir``), read with no
    decode from then on; label images are decoded from their PNG bytes as without it,
    and items are equal to those without it. ``crop``: a
    :class:`~fastload.decode.RandomPatch` or :class:`~fastload.decode.FixedCrop`
    cuts the image and its label targets with the same box, drawn from the image's
    size per ``(seed, epoch, sample key)`` as :class:`~fastload.decode.CropDecoder`
    draws (``set_epoch(e)`` moves to epoch ``e``, in DataLoader workers too); only the
    box is decoded where the image is a JPEG, and with ``pixel_cache`` the box is cut
    from the stored pixels. Polygon targets are refused with a crop.

    ``ds.root`` is the URL. Where torchvision imports this is a
    ``torchvision.datasets.Cityscapes`` (``wrap_dataset_for_transforms_v2`` takes it,
    for semantic and instance targets). ``ds.source`` is the
    :class:`~fastload.datasets.source.ShardSource` the raw samples come from and
    ``ds.build_item(sample)`` makes ``ds[i]`` of ``ds.source.read(i)`` (what
    :class:`fastload.DataLoader`'s cache transport calls).

    Raises :class:`ConfigError` (a ``ValueError``) for a bad split, mode or target
    type, bad transforms, or a dataset that is not that Cityscapes split;
    ``TypeError`` for a transform that is not callable.
    """

    classes: ClassVar[list[CityscapesClass]] = list(CITYSCAPES_CLASSES)

    @keyword_only("cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
        split: str = "train",
        mode: str = "fine",
        target_type: str | Sequence[str] = "instance",
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        transforms: Callable[..., Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        pixel_cache: bool | PixelCache = False,
        crop: RandomPatch | FixedCrop | None = None,
        seed: int = 0,
    ) -> None:
        init_vision(self, "Cityscapes", str(url), transforms, transform, target_transform)
        validate_split_mode(split, mode)
        raw = list(target_type) if isinstance(target_type, (list, tuple)) else [target_type]
        types = [_one_of(t, "target_type", TARGET_TYPES) for t in raw]
        if not types:
            raise ConfigError("target_type must name at least one target type")
        self.split = split
        self.mode = CITYSCAPES_MODES[mode]  # torchvision keeps "gtFine" / "gtCoarse" here
        self.target_type: list[str] = types
        cache = (cache_dir, cache_limit, ram_limit, storage_options, cache_config, fetch)
        self.source, facts = open_converted("cityscapes", url, *cache)
        if (facts.get("split"), facts.get("mode")) != (split, mode):
            raise ConfigError(
                f"{self.url} holds Cityscapes split {facts.get('split')!r} mode "
                f"{facts.get('mode')!r}, not split {split!r} mode {mode!r}; each split is "
                "converted to its own URL"
            )
        fields = target_fields(mode)
        self._fields = [fields[t] for t in types]
        #: the decoded-pixel tier (``pixel_cache=``), None when off
        self.pixels: PixelTier | None = pixel_tier(self.source, pixel_cache)
        if crop is not None and not isinstance(crop, (RandomPatch, FixedCrop)):
            raise ConfigError(f"Cityscapes crop must be RandomPatch or FixedCrop, got {crop!r}")
        if crop is not None and "polygon" in types:
            raise ConfigError(
                "Cityscapes crop cuts the image and its label images; polygon targets "
                "would not be cut: ask for semantic, instance or color targets"
            )
        self.crop = crop
        self._cropper = None if crop is None else CropDecoder(crop, seed=seed, image="numpy")
        self._epoch = None if crop is None else EpochCell(-1)
        self._applied = -1

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s crops (with ``crop``), here and, through shared
        memory, in the DataLoader workers holding copies (persistent ones too)."""
        if self._epoch is not None:
            self._epoch.set(epoch)
            self._applied = int(epoch)
            forward_epoch(self._cropper, epoch)

    def __len__(self) -> int:
        return len(self.source)

    def build_item(self, sample: Mapping[str, Any]) -> tuple[Any, Any]:
        """``ds[i]`` made from ``sample = ds.source.read(i)`` (fields as bytes or
        memoryviews): the image and the target(s), through ``transforms``."""
        key = sample.get("__key__")
        try:
            image_data = sample[IMAGE_FIELD]
            targets_data = [sample[name] for name in self._fields]
        except KeyError as exc:
            raise ShardFormatError(f"sample {key!r} has no field {exc}", self.url) from None
        box = None if self._cropper is None else self._box(image_data, key)
        image = rgb_image(image_data, key) if box is None else self._cut(image_data, box, key)
        targets: list[Any] = []
        for t, data in zip(self.target_type, targets_data, strict=True):
            if isinstance(data, (bytes, bytearray, memoryview)):
                raw = as_bytes(data)
                data = json.loads(raw) if t == "polygon" else open_image(raw, name=key)[0]
            # else decoded already (the pixel tier's decoder)
            targets.append(data if box is None else _cut_label(data, box, f"{key}.{t}"))
        target: Any = tuple(targets) if len(targets) > 1 else targets[0]
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target

    def _box(self, image: Any, key: Any) -> tuple[int, int, int, int]:
        cropper = self._cropper
        assert cropper is not None
        if self._epoch is not None:
            epoch = self._epoch.get()
            if epoch >= 0 and epoch != self._applied:
                self._applied = epoch
                forward_epoch(cropper, epoch)
        label = f"{key}.{IMAGE_FIELD}"
        width, height = image.size if hasattr(image, "size") else image_size(image, name=label)
        box = cropper.crop.box(width, height, cropper.rng(str(key)))
        left, top, w, h = box
        if left < 0 or top < 0 or left + w > width or top + h > height:
            raise ConfigError(f"crop {box} is not inside image {label!r} of {width}x{height}")
        return box

    def _cut(self, image: Any, box: tuple[int, int, int, int], key: Any) -> Any:
        left, top, w, h = box
        if hasattr(image, "crop"):  # the pixel tier's RGB image: cut, no decode
            return rgb_image(image, key).crop((left, top, left + w, top + h))
        from PIL import Image

        return Image.fromarray(decode_crop(image, box, mode="RGB", name=f"{key}.{IMAGE_FIELD}"))

    def __repr__(self) -> str:
        return (
            f"Cityscapes({self.url!r}, split={self.split!r}, mode={self.mode!r}, "
            f"target_type={self.target_type!r}, samples={len(self)})"
        )


def _cut_label(img: Any, box: tuple[int, int, int, int], label: str) -> Any:
    """A label image cut to ``box`` (a :class:`ShardFormatError` if it is smaller)."""
    left, top, w, h = box
    if img.size[0] < left + w or img.size[1] < top + h:
        raise ShardFormatError(
            f"label image {label!r} of {img.size[0]}x{img.size[1]} is smaller than the "
            f"crop {box} of its image"
        )
    return img.crop((left, top, left + w, top + h))
