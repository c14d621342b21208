"""fastload: training data from object storage at the speed of the hardware.

The public names are re-exported here and resolved lazily, so ``import fastload``
is cheap and works with only the core dependencies installed; parts that need
torch, DALI or s3fs import them when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastload import errors as _errors
from fastload.errors import *  # noqa: F403  (every public error class, see errors.__all__)
from fastload.errors import MissingDependencyError

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "CacheConfig": "fastload.config",
    "Cityscapes": "fastload.datasets.cityscapes",
    "CocoDetection": "fastload.datasets.coco",
    "DataLoader": "fastload.loader.dataloader",
    "FetchConfig": "fastload.config",
    "ImageFolder": "fastload.datasets.folder",
    "Manifest": "fastload.shards.manifest",
    "Mix": "fastload.datasets.mix",
    "ParquetDataset": "fastload.text.parquet",
    "ParquetTokenDataset": "fastload.text.parquet_tokens",
    "PixelCache": "fastload.decode.pixels",
    "RetryConfig": "fastload.config",
    "RetryPolicy": "fastload.storage.retry",
    "ShardIndex": "fastload.shards.index",
    "ShardReader": "fastload.shards.reader",
    "ShardWriter": "fastload.shards.writer",
    "ShardedDataset": "fastload.datasets.sharded",
    "StreamingDataset": "fastload.datasets.streaming",
    "TokenDataset": "fastload.text.tokens",
    "World": "fastload.sampling.world",
    "cached": "fastload.datasets.cached",
    "parse_size": "fastload.config",
    "write_manifest": "fastload.shards.adopt",
}
_LAZY_MODULES = ("convert", "dali")

__all__ = sorted(
    [
        *_errors.__all__,
        "__version__",
        *_LAZY,
        *_LAZY_MODULES,
    ]
)


# top-level package of an optional dependency -> (pip name, fastload extra)
_EXTRAS = {
    "torch": ("torch", "torch"),
    "nvidia": ("nvidia-dali-cuda120", "dali"),
    "s3fs": ("s3fs", "s3"),
    "PIL": ("Pillow", "image"),
    "pycocotools": ("pycocotools", "coco"),
    "tokenizers": ("tokenizers", "text"),
    "pyarrow": ("pyarrow", "text"),
}


def _import(module: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in _EXTRAS:
            package, extra = _EXTRAS[missing]
            raise MissingDependencyError(package, extra, f"fastload.{name}") from exc
        raise


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(_import(_LAZY[name], name), name)
        globals()[name] = value
        return value
    if name in _LAZY_MODULES:
        module = _import(f"fastload.{name}", name)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from fastload import convert, dali
    from fastload.config import CacheConfig, FetchConfig, RetryConfig, parse_size
    from fastload.datasets.cached import cached
    from fastload.datasets.cityscapes import Cityscapes
    from fastload.datasets.coco import CocoDetection
    from fastload.datasets.folder import ImageFolder
    from fastload.datasets.sharded import ShardedDataset
    from fastload.datasets.streaming import StreamingDataset
    from fastload.decode.pixels import PixelCache
    from fastload.loader.dataloader import DataLoader
    from fastload.sampling.world import World
    from fastload.shards.index import ShardIndex
    from fastload.shards.manifest import Manifest
    from fastload.shards.reader import ShardReader
    from fastload.shards.writer import ShardWriter
    from fastload.storage.retry import RetryPolicy
    from fastload.text.parquet import ParquetDataset
    from fastload.text.parquet_tokens import ParquetTokenDataset
    from fastload.text.tokens import TokenDataset
