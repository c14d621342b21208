"""``fastload.ImageFolder``: torchvision's ``ImageFolder`` over fastload shards.

Item ``i`` is ``(PIL RGB image, class index)`` for the ``i``-th image in
``ImageFolder``'s order, exactly what ``torchvision.datasets.ImageFolder(root)[i]``
returns on the original folder (``fastload convert folder`` writes the samples in
that order, each with its image bytes and its ``cls``). Where torchvision imports,
``ImageFolder`` is a subclass of torchvision's (:mod:`fastload.datasets.vision`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.coco import as_bytes, open_converted, pixel_tier, rgb_image
from fastload.datasets.pixels import PixelTier
from fastload.datasets.source import BuiltItems
from fastload.datasets.vision import FolderBase, init_vision
from fastload.decode.pixels import PixelCache
from fastload.errors import ShardFormatError

__all__ = ["ImageFolder"]


class ImageFolder(BuiltItems, FolderBase):
    """Image classification samples from a dataset written by ``fastload.convert.folder``.

    ``ds[i]`` is ``(image, target)``: the PIL image ``.convert("RGB")`` (torchvision's
    default loader) and its class index, with ``transform`` applied to the image and
    ``target_transform`` to the index. ``ds.classes`` (sorted class folder names),
    ``ds.class_to_idx``, ``ds.extensions`` and ``ds.root`` (the URL) are read from the
    manifest. ``ds.samples`` (also ``ds.imgs``) lists ``(name, class index)`` per
    item and ``ds.targets`` the class indices; the shards do not keep the original
    file paths, so ``name`` is ``"<url>/<sample key>"``. Those two lists are built
    on first access from every sample's ``cls``, which reads each shard once.
    ``cache_dir``, ``cache_limit``, ``ram_limit``, ``storage_options``,
    ``cache_config`` and ``fetch`` configure the cache as for
    :class:`fastload.ShardedDataset`. ``pixel_cache``: ``True`` or a
    :class:`~fastload.PixelCache` keeps each image's decoded RGB pixels in the node's
    disk tier (``cache_dir``), read with no decode from then on; items are equal to
    those without it.

    Where torchvision imports this is a ``torchvision.datasets.ImageFolder``
    (``wrap_dataset_for_transforms_v2`` takes it; ``ds.transforms`` is the
    ``StandardTransform`` of the two). ``ds.source`` is the
    :class:`~fastload.datasets.source.ShardSource` the raw samples come from and
    ``ds.build_item(sample)`` makes ``ds[i]`` of ``ds.source.read(i)`` (what
    :class:`fastload.DataLoader`'s cache transport calls).

    Raises :class:`ConfigError` if the dataset was not written by the folder
    converter, :class:`ShardFormatError` for a sample without an image or ``cls``,
    ``TypeError`` for a transform that is not callable (a path where torchvision
    takes ``transform``).
    """

    @keyword_only("cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        pixel_cache: bool | PixelCache = False,
    ) -> None:
        init_vision(self, "ImageFolder", str(url), None, transform, target_transform)
        cache = (cache_dir, cache_limit, ram_limit, storage_options, cache_config, fetch)
        self.source, facts = open_converted("folder", url, *cache)
        classes = facts.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ShardFormatError("manifest source 'classes' is not a list of names", self.url)
        self.classes: list[str] = classes
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(classes)}
        self.extensions: tuple[str, ...] = tuple(facts.get("extensions", ()))
        # shared through torchvision's v2 wrapper (it runs `samples` on itself and
        # forwards `_samples_box`), so the shards are listed once
        self._samples_box: list[list[tuple[str, int]] | None] = [None]
        #: the decoded-pixel tier (``pixel_cache=``), None when off
        self.pixels: PixelTier | None = pixel_tier(self.source, pixel_cache)

    def __len__(self) -> int:
        return len(self.source)

    def build_item(self, sample: Mapping[str, Any]) -> tuple[Any, Any]:
        """``ds[i]`` made from ``sample = ds.source.read(i)`` (fields as bytes or
        memoryviews): the image and class index, through ``transform`` and
        ``target_transform``."""
        target = self._target(sample)
        fields = [k for k in sample if k != "cls" and not k.startswith("__")]
        if len(fields) != 1:
            raise ShardFormatError(
                f"sample {sample.get('__key__')!r} has no single image field "
                f"(fields: {sorted(fields)})",
                self.url,
            )
        image: Any = rgb_image(sample[fields[0]], sample.get("__key__"))
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _target(self, sample: Mapping[str, Any]) -> int:
        raw = sample.get("cls")
        try:
            # an int where the pixel tier's decoder parsed it already
            target = raw if isinstance(raw, int) else int(as_bytes(raw).decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError):
            raise ShardFormatError(
                f"sample {sample.get('__key__')!r} has no integer 'cls' field", self.url
            ) from None
        if not 0 <= target < len(self.classes):
            raise ShardFormatError(
                f"sample {sample.get('__key__')!r} has class {target}, but the manifest "
                f"lists {len(self.classes)} classes",
                self.url,
            )
        return target

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(name, class index)`` of every item; ``name`` is ``"<url>/<sample key>"``."""
        box = self._samples_box
        out = box[0]
        if out is None:
            out = []
            for i in range(len(self.source)):
                sample = self.source.read(i)
                out.append((f"{self.url.rstrip('/')}/{sample['__key__']}", self._target(sample)))
            box[0] = out
        return out

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """torchvision's alias of :attr:`samples`."""
        return self.samples

    @property
    def targets(self) -> list[int]:
        """The class index of every item."""
        return [t for _, t in self.samples]

    def __repr__(self) -> str:
        return f"ImageFolder({self.url!r}, samples={len(self)}, classes={len(self.classes)})"
