"""Converters from common dataset layouts to fastload shards.

``coco(images, annotations, out)``, ``cityscapes(root, out, split=...)`` and
``folder(root, out)`` read the original files on a thread pool, check every image
decodes, and write WebDataset tar shards, index sidecars and ``manifest.json``
through :class:`fastload.ShardWriter`. Each returns a :class:`ConvertReport`.
``text(sources, out, tokenizer=...)`` tokenizes JSONL/parquet documents into token shards.
:mod:`fastload.convert.synthetic` makes small datasets in the original layouts.
"""

from __future__ import annotations

from fastload.convert import synthetic
from fastload.convert._cityscapes import cityscapes
from fastload.convert._coco import coco
from fastload.convert._common import ConvertReport, SkippedItem, SourceDataError
from fastload.convert._folder import IMG_EXTENSIONS, folder
from fastload.text.converter import TextConvertReport, text

__all__ = [
    "IMG_EXTENSIONS",
    "ConvertReport",
    "SkippedItem",
    "SourceDataError",
    "TextConvertReport",
    "cityscapes",
    "coco",
    "folder",
    "synthetic",
    "text",
]
