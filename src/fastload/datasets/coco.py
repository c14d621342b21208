"""``fastload.CocoDetection``: torchvision's ``CocoDetection`` over fastload shards.

Item ``i`` is ``(PIL RGB image, [annotation dicts])`` for the image with the
``i``-th smallest id, exactly what ``torchvision.datasets.CocoDetection(root,
annFile)[i]`` returns on the original files (the converter writes samples in
ascending id with the annotations pycocotools' ``loadAnns`` gives).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.decode.image import open_image
from fastload.errors import ConfigError, MissingDependencyError, ShardFormatError

__all__ = ["CocoCategories", "CocoDetection", "PairTransform", "build_coco", "open_converted"]


class SampleSource(Protocol):
    """What the drop-ins read from: a map-style dataset of dict samples with a manifest."""

    @property
    def manifest(self) -> Any: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Mapping[str, Any]: ...


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
) -> tuple[SampleSource, Mapping[str, Any]]:
    """Open the dataset at ``url`` as a :class:`fastload.ShardedDataset` (the drop-ins'
    cache and storage arguments go to it unchanged) and return it with its manifest's
    source facts; a dataset that ``fastload convert KIND`` did not write is a
    :class:`ConfigError` naming it."""
    from fastload.datasets.sharded import ShardedDataset

    url = str(url)
    data = ShardedDataset(
        url,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        ram_limit=ram_limit,
        storage_options=storage_options,
        cache_config=cache_config,
        fetch=fetch,
    )
    source = data.manifest.source
    if source.get("kind") != kind:
        raise ConfigError(
            f"{url}: not {KIND_NAMES[kind]} (manifest source kind is "
            f"{source.get('kind')!r}); write one with `fastload convert {kind}`"
        )
    return data, source


def pil_image() -> Any:
    """Return ``PIL.Image``, or raise :class:`MissingDependencyError` naming the extra."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is in the image extra
        raise MissingDependencyError("Pillow", "image", "decoding images") from None
    return Image


def as_bytes(value: Any) -> bytes:
    """A sample field as ``bytes`` (fields may arrive as memoryviews of a mapped shard)."""
    return value if isinstance(value, bytes) else bytes(value)


class PairTransform:
    """torchvision's ``StandardTransform``: apply ``transform`` to the image and
    ``target_transform`` to the target (either may be ``None``)."""

    def __init__(
        self, transform: Callable[..., Any] | None, target_transform: Callable[..., Any] | None
    ) -> None:
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, image: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __repr__(self) -> str:
        return (
            f"PairTransform(transform={self.transform!r}, "
            f"target_transform={self.target_transform!r})"
        )


def combine_transforms(
    transforms: Callable[..., Any] | None,
    transform: Callable[..., Any] | None,
    target_transform: Callable[..., Any] | None,
) -> Callable[[Any, Any], tuple[Any, Any]] | None:
    """The joint transform, as torchvision's ``VisionDataset`` builds it.

    Raises :class:`ConfigError` (a ``ValueError``) if ``transforms`` is given together
    with ``transform`` or ``target_transform``.
    """
    separate = transform is not None or target_transform is not None
    if transforms is not None and separate:
        raise ConfigError("Only transforms or transform/target_transform can be passed as argument")
    if separate:
        return PairTransform(transform, target_transform)
    return transforms


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


class CocoDetection:
    """COCO detection samples from a dataset written by ``fastload.convert.coco``.

    ``ds[i]`` is ``(image, target)``: the PIL image ``.convert("RGB")`` and the list
    of annotation dicts, for image id ``ds.ids[i]`` (ascending), with torchvision's
    ``transform`` / ``target_transform`` / ``transforms`` semantics. ``cache_dir``,
    ``cache_limit``, ``ram_limit``, ``storage_options``, ``cache_config`` and
    ``fetch`` are passed to :class:`fastload.ShardedDataset`. ``ds.coco`` is a
    ``pycocotools.coco.COCO`` holding the dataset's images, annotations and
    categories (built on first use from the shards' annotations, so ``COCOeval``
    works on it); ``ds.categories`` gives the categories alone, from the manifest,
    without reading a shard. Everything after ``url`` is keyword-only.

    Raises :class:`ConfigError` if the dataset is not a converted COCO dataset or
    transforms are combined wrongly.
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
    ) -> None:
        self.transforms = combine_transforms(transforms, transform, target_transform)
        self.transform = transform
        self.target_transform = target_transform
        self.url = str(url)
        cache = (cache_dir, cache_limit, ram_limit, storage_options, cache_config, fetch)
        self.data, source = open_converted("coco", url, *cache)
        ids = source.get("image_ids")
        if not isinstance(ids, list) or len(ids) != len(self.data):
            raise ShardFormatError(
                f"manifest source 'image_ids' lists {len(ids) if isinstance(ids, list) else 'no'}"
                f" ids for {len(self.data)} samples",
                self.url,
            )
        self.ids: list[int] = ids
        self.categories = CocoCategories(source)
        self._coco: Any = None

    @property
    def coco(self) -> Any:
        """The ``pycocotools.coco.COCO`` of the dataset, as torchvision's ``ds.coco``.

        Built once per process on first access, from the manifest's info, licenses
        and categories and every sample's ``json`` (its image entry and
        annotations), so it reads every shard once. Raises
        :class:`MissingDependencyError` without pycocotools (extra ``coco``).
        """
        if self._coco is None:
            self._coco = build_coco(self.categories.dataset, self._annotation_docs())
        return self._coco

    def _annotation_docs(self) -> Iterable[Mapping[str, Any]]:
        for i in range(len(self.data)):
            yield json.loads(as_bytes(self.data[i]["json"]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_coco"] = None  # rebuilt on demand in the receiving process
        return state

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample = self.data[index]
        doc = json.loads(as_bytes(sample["json"]))
        data = as_bytes(sample[_image_field(sample, doc)])
        image = open_image(data, name=sample.get("__key__"))[0]
        image = image.convert("RGB")
        target = doc["annotations"]
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target

    def __repr__(self) -> str:
        return f"CocoDetection({self.url!r}, samples={len(self)})"


def build_coco(header: Mapping[str, Any], docs: Iterable[Mapping[str, Any]]) -> Any:
    """A ``pycocotools.coco.COCO`` over ``header`` (``info``, ``licenses``,
    ``categories``) and the per-image documents ``{"image": ..., "annotations":
    [...]}`` the COCO converter writes, indexed as if read from the original file.

    Raises :class:`MissingDependencyError` without pycocotools (extra ``coco``),
    :class:`ShardFormatError` for a document without an image entry.
    """
    try:
        from pycocotools.coco import COCO
    except ImportError:
        raise MissingDependencyError("pycocotools", "coco", "CocoDetection.coco") from None
    images: list[Any] = []
    annotations: list[Any] = []
    for doc in docs:
        image = doc.get("image")
        if not isinstance(image, dict) or "id" not in image:
            raise ShardFormatError("a COCO sample's json has no 'image' entry with an 'id'")
        images.append(image)
        annotations.extend(doc.get("annotations", []))
    coco = COCO()
    coco.dataset = {
        "info": header.get("info", {}),
        "licenses": list(header.get("licenses", [])),
        "images": images,
        "annotations": annotations,
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
