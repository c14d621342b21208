"""Datasets: :class:`ShardedDataset` (map-style), :class:`StreamingDataset` (iterable),
the torchvision drop-ins :class:`CocoDetection`, :class:`Cityscapes` and
:class:`ImageFolder`, and
:func:`cached` for any existing map-style dataset; for text, :class:`TokenDataset`
(windows of token shards) and :class:`ParquetDataset` (parquet rows, or windows
tokenized once per node).

Import them from ``fastload`` (resolved lazily); the submodules import torch only
where they need it (``streaming``).
"""
