"""The storage layer: URL + storage_options → an :class:`ObjectStore` with retried,
counted, resumable and parallel reads over s3fs (``s3://``, ``cos://``) or fsspec.

Importing this package needs neither s3fs nor botocore; they are imported when the
first ``s3://``/``cos://`` store is used.
"""

from __future__ import annotations

from fastload.storage.retry import (
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    TruncatedBodyError,
    classify,
)
from fastload.storage.store import ObjectStore, StoreStats, open_store
from fastload.storage.url import S3Settings, is_s3_like, join, resolve_s3, split_url

__all__ = [
    "AccessDeniedError",
    "ObjectNotFoundError",
    "ObjectStore",
    "RetryPolicy",
    "S3Settings",
    "StoreStats",
    "TruncatedBodyError",
    "classify",
    "is_s3_like",
    "join",
    "open_store",
    "resolve_s3",
    "split_url",
]
