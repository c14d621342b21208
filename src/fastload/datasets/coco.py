"""``fastload.CocoDetection``: torchvision's ``CocoDetection`` over fastload shards.

Item ``i`` is ``(PIL RGB image, [annotation dicts])`` for the image with the
``i``-th smallest id, exactly what ``torchvision.datasets.CocoDetection(root,
annFile)[i]`` returns on the original files (the converter writes samples in
ascending id with the annotations pycocotools' ``loadAnns`` gives). Where
torchvision imports, the class is a subclass of torchvision's
(:mod:`fastload.datasets.vision`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.pixels import PixelTier, tier_or_none
from fastload.datasets.source import BuiltItems, ShardSource
from fastload.datasets.vision import (
    CocoBase,
    PairTransform,
    combine_transforms,
    init_vision,
)
from fastload.decode.image import open_image
from fastload.decode.pixels import PixelCache
from fastload.errors import ConfigError, MissingDependencyError, ShardFormatError

__all__ = [
    "CocoCategories",
    "CocoDetection",
    "PairTransform",
    "as_bytes",
    "build_coco",
    "combine_transforms",
    "open_converted",
    "pixel_tier",
    "rgb_image",
]


#: What each converter's datasets are called in a refusal, by manifest source kind.
KIND_NAMES = {"coco": "a COCO dataset", "cityscapes": "a Cityscapes dataset",
              "folder": "an image-folder dataset"}  # fmt: skip


def open_converted(
    kind: str,
    url: str,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | str | None,
    ram_limit: int | str | None,
    storage_options: Mapping[str, Any] | None,
    cache_config: CacheConfig | None,
    fetch: FetchConfig | None,
) -> tuple[ShardSource, Mapping[str, Any]]:
    """Open the dataset at ``url`` as a :class:`ShardSource` (the drop-ins' cache and
    storage arguments go to it unchanged, as :class:`fastload.ShardedDataset` passes
    them) and return it with its manifest's source facts; a dataset that ``fastload
    convert KIND`` did not write is a :class:`ConfigError` naming it."""
    url = str(url)
    source = ShardSource(
        url,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        ram_limit=ram_limit,
        storage_options=storage_options,
        cache_config=cache_config,
        fetch=fetch,
    )
    facts = source.manifest.source
    if facts.get("kind") != kind:
        raise ConfigError(
            f"{url}: not {KIND_NAMES[kind]} (manifest source kind is "
            f"{facts.get('kind')!r}); write one with `fastload convert {kind}`"
        )
    return source, facts


def pixel_tier(source: ShardSource, pixel_cache: bool | PixelCache) -> PixelTier | None:
    """A drop-in's decoded-pixel tier (``pixel_cache=``; None when off): images decoded
    as the drop-ins decode them (``.convert("RGB")``, full size unless ``max_side``),
    JSON and ``cls`` parsed, label PNGs decoded keeping their mode, as
    :class:`~fastload.decode.Decoder` ``(image="pil", mode="RGB")`` gives them."""
    if pixel_cache is None or pixel_cache is False:
        return None
    from fastload.decode import Decoder

    return tier_or_none(source, Decoder(image="pil", mode="RGB"), pixel_cache)


def rgb_image(value: Any, key: Any) -> Any:
    """A sample's image field as an RGB PIL image: already decoded (the pixel tier), or
    decoded here from its bytes."""
    if hasattr(value, "mode") and hasattr(value, "convert"):
        return value if value.mode == "RGB" else value.convert("RGB")
    return open_image(as_bytes(value), name=key)[0].convert("RGB")


def as_bytes(value: Any) -> bytes:
    """A sample field as ``bytes`` (fields may arrive as memoryviews of a mapped shard)."""
    return value if isinstance(value, bytes) else bytes(value)


class CocoCategories:
    """The cheap part of pycocotools' ``COCO`` object: categories, info and licenses
    (``.dataset``, ``.cats``, ``getCatIds()``, ``loadCats()``), from the manifest."""

    def __init__(self, source: Mapping[str, Any]) -> None:
        categories = list(source.get("categories", []))
        self.dataset = {
            "info": source.get("info", {}),
            "licenses": list(source.get("licenses", [])),
            "categories": categories,
        }
        self.cats: dict[int, dict[str, Any]] = {c["id"]: c for c in categories}

    def getCatIds(self) -> list[int]:  # pycocotools' name
        """All category ids, in file order."""
        return [c["id"] for c in self.dataset["categories"]]

    def loadCats(self, ids: int | Iterable[int] = ()) -> list[dict[str, Any]]:
        """The category dicts of ``ids`` (one id or several)."""
        if isinstance(ids, int):
            return [self.cats[ids]]
        return [self.cats[i] for i in ids]


class CocoDetection(BuiltItems, CocoBase):
    """COCO detection samples from a dataset written by ``fastload.convert.coco``.

    ``ds[i]`` is ``(image, target)``: the PIL image ``.convert("RGB")`` and the list
    of annotation dicts, for image id ``ds.ids[i]`` (ascending), with torchvision's
    ``transform`` / ``target_transform`` / ``transforms`` semantics (``transforms`` is
    a ``StandardTransform`` of the separate ones). ``cache_dir``, ``cache_limit``,
    ``ram_limit``, ``storage_options``, ``cache_config`` and ``fetch`` configure the
    cache as for :class:`fastload.ShardedDataset`. ``ds.coco`` is a
    ``pycocotools.coco.COCO`` holding the dataset's images, annotations and
    categories (built on first use from the shards' annotations, so ``COCOeval``
    works on it); ``ds.categories`` gives the categories alone, from the manifest,
    without reading a shard. ``ds.root`` is the URL. ``pixel_cache``: ``True`` or a
    :class:`~fastload.PixelCache` keeps each image's decoded RGB pixels in the node's
    disk tier (``cache_dir``), read with no decode from then on; items are equal to
    those without it (``max_side`` bounds the stored images, and then the items, too).

    Where torchvision imports this is a ``torchvision.datasets.CocoDetection``
    (``wrap_dataset_for_transforms_v2`` takes it); a subclass may override
    ``_load_image(id)`` and ``_load_target(id)`` as torchvision's hooks.
    ``ds.source`` is the :class:`~fastload.datasets.source.ShardSource` the raw
    samples come from and ``ds.build_item(sample)`` makes ``ds[i]`` of
    ``ds.source.read(i)`` (what :class:`fastload.DataLoader`'s cache transport calls).

    Raises :class:`ConfigError` if the dataset is not a converted COCO dataset or
    transforms are combined wrongly, ``TypeError`` for a transform that is not
    callable (torchvision's ``CocoDetection(root, annFile)`` call shape).
    """

    @keyword_only("cache_dir", "cache_limit", "storage_options")
    def __init__(
        self,
        url: str,
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
    ) -> None:
        init_vision(self, "CocoDetection", str(url), transforms, transform, target_transform)
        cache = (cache_dir, cache_limit, ram_limit, storage_options, cache_config, fetch)
        self.source, facts = open_converted("coco", url, *cache)
        #: the decoded-pixel tier (``pixel_cache=``), None when off
        self.pixels: PixelTier | None = pixel_tier(self.source, pixel_cache)
        ids = facts.get("image_ids")
        if not isinstance(ids, list) or len(ids) != len(self.source):
            raise ShardFormatError(
                f"manifest source 'image_ids' lists {len(ids) if isinstance(ids, list) else 'no'}"
                f" ids for {len(self.source)} samples",
                self.url,
            )
        self.ids: list[int] = ids
        self.categories = CocoCategories(facts)
        # a one-element box, not an attribute set on first use: torchvision's v2 wrapper
        # subclasses this class, so `wrapper.coco` runs this property on the wrapper,
        # whose `_coco_box` is the wrapped dataset's (forwarded): one COCO, not two
        self._coco_box: list[Any] = [None]
        self._positions: dict[int, int] | None = None

    @property
    def coco(self) -> Any:
        """The ``pycocotools.coco.COCO`` of the dataset, as torchvision's ``ds.coco``.

        Built once per process on first access, from the manifest's info, licenses
        and categories and every sample's ``json`` (its image entry and
        annotations), so it reads every shard once; images and annotations are listed
        in the annotation file's order (``getImgIds()``, ``getAnnIds()``) when the
        converter recorded it. Through torchvision's ``wrap_dataset_for_transforms_v2``
        it is the wrapped dataset's object (what the reference's evaluator takes).
        Raises :class:`MissingDependencyError` without pycocotools (extra ``coco``).
        """
        box = self._coco_box
        if box[0] is None:
            box[0] = build_coco(self.categories.dataset, self._annotation_docs())
        return box[0]

    def _annotation_docs(self) -> Iterable[Mapping[str, Any]]:
        for i in range(len(self.source)):
            yield json.loads(as_bytes(self.source.read(i)["json"]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_coco_box"] = [None]  # rebuilt on demand in the receiving process
        return state

    def __len__(self) -> int:
        return len(self.ids)

    def build_item(self, sample: Mapping[str, Any]) -> tuple[Any, Any]:
        """``ds[i]`` made from ``sample = ds.source.read(i)`` (fields as bytes or
        memoryviews, or as the pixel tier decoded them): the image and target, through
        the hooks and ``transforms``."""
        doc = _sample_doc(sample, self.url)
        image_id = doc["image"]["id"]
        cls = type(self)
        if cls._load_image is CocoDetection._load_image:
            image = self._decode(sample, doc)
        else:  # a subclass's hook, as torchvision calls it
            image = self._load_image(image_id)
        if cls._load_target is CocoDetection._load_target:
            target = doc["annotations"]
        else:
            target = self._load_target(image_id)
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target

    def _load_image(self, id: int) -> Any:
        """The RGB PIL image of image id ``id`` (torchvision's hook)."""
        sample = self.source.read(self._position(id))
        return self._decode(sample, _sample_doc(sample, self.url))

    def _load_target(self, id: int) -> list[Any]:
        """The annotation dicts of image id ``id`` (torchvision's hook)."""
        return list(_sample_doc(self.source.read(self._position(id)), self.url)["annotations"])

    def _position(self, image_id: int) -> int:
        if self._positions is None:
            self._positions = {i: k for k, i in enumerate(self.ids)}
        try:
            return self._positions[image_id]
        except KeyError:
            raise KeyError(f"{self.url}: no image with id {image_id!r}") from None

    def _decode(self, sample: Mapping[str, Any], doc: Mapping[str, Any]) -> Any:
        return rgb_image(sample[_image_field(sample, doc)], sample.get("__key__"))

    def __repr__(self) -> str:
        return f"CocoDetection({self.url!r}, samples={len(self)})"


def _sample_doc(sample: Mapping[str, Any], url: str) -> Any:
    """A COCO sample's parsed ``json``: ``{"image": {...}, "annotations": [...]}``."""
    try:
        doc = sample["json"]
        if not isinstance(doc, dict):  # parsed already by the pixel tier's decoder
            doc = json.loads(as_bytes(doc))
        doc["image"]["id"]  # present, or the sample is malformed
        doc["annotations"]
    except (KeyError, TypeError, ValueError):
        raise ShardFormatError(
            f"sample {sample.get('__key__')!r} has no COCO 'json' with an image id and annotations",
            url,
        ) from None
    return doc


def build_coco(header: Mapping[str, Any], docs: Iterable[Mapping[str, Any]]) -> Any:
    """A ``pycocotools.coco.COCO`` over ``header`` (``info``, ``licenses``,
    ``categories``) and the per-image documents ``{"image": ..., "annotations":
    [...], "order": ...}`` the COCO converter writes, indexed as if read from the
    original file: in its order where every document has ``order`` (older datasets
    have none: images in the documents' order, each one's annotations after it).

    Raises :class:`MissingDependencyError` without pycocotools (extra ``coco``),
    :class:`ShardFormatError` for a document without an image entry.
    """
    try:
        from pycocotools.coco import COCO
    except ImportError:
        raise MissingDependencyError("pycocotools", "coco", "CocoDetection.coco") from None
    images: list[tuple[Any, Any]] = []
    annotations: list[tuple[Any, Any]] = []
    ordered = True  # every document says where its entries stood in the file
    for doc in docs:
        image = doc.get("image")
        if not isinstance(image, dict) or "id" not in image:
            raise ShardFormatError("a COCO sample's json has no 'image' entry with an 'id'")
        anns = list(doc.get("annotations", []))
        order = doc.get("order")
        places = order.get("annotations") if isinstance(order, dict) else None
        if not isinstance(places, list) or len(places) != len(anns):
            ordered, places = False, [None] * len(anns)
        images.append((order.get("image") if isinstance(order, dict) else None, image))
        annotations.extend(zip(places, anns, strict=True))
    if ordered and all(isinstance(k, int) for k, _ in (*images, *annotations)):
        images.sort(key=lambda e: e[0])
        annotations.sort(key=lambda e: e[0])
    coco = COCO()
    coco.dataset = {
        "info": header.get("info", {}),
        "licenses": list(header.get("licenses", [])),
        "images": [image for _, image in images],
        "annotations": [ann for _, ann in annotations],
        "categories": list(header.get("categories", [])),
    }
    with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints progress
        coco.createIndex()
    return coco


def _image_field(sample: Mapping[str, Any], doc: Mapping[str, Any]) -> str:
    """The field holding the image: the only field besides ``json``, else the one
    named by the extension of the image's ``file_name``."""
    fields: Sequence[str] = [k for k in sample if k != "json" and not k.startswith("__")]
    if len(fields) == 1:
        return fields[0]
    ext = os.path.splitext(str(doc.get("image", {}).get("file_name", "")))[1][1:].lower()
    if ext in sample:
        return ext
    raise ShardFormatError(
        f"sample {sample.get('__key__')!r} has no single image field (fields: {sorted(fields)})"
    )
