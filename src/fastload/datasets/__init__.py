"""Datasets: :class:`ShardedDataset` (map-style), :class:`StreamingDataset` (iterable),
the torchvision drop-ins :class:`CocoDetection`, :class:`Cityscapes` and
:class:`ImageFolder`, and
:func:`cached` for any existing map-style dataset. The text datasets
(:class:`~fastload.TokenDataset`, :class:`~fastload.ParquetDataset`,
:class:`~fastload.ParquetTokenDataset`) live in :mod:`fastload.text`.

Import them from ``fastload`` (resolved lazily); the submodules import torch only
where they need it (``streaming``).
"""
