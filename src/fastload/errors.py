"""The one exception hierarchy of fastload.

Every error fastload raises on purpose is a :class:`FastloadError`. Messages name
the file or object concerned and say what is wrong and, where it applies, where
(a byte offset, a sample key, a URL).
"""

from __future__ import annotations

import os

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "CacheFullError",
    "CatalogBusy",
    "ConfigError",
    "CorruptImageError",
    "DecodeError",
    "FastloadError",
    "FetchError",
    "IntegrityError",
    "LeaseExpired",
    "LocalS3Error",
    "LockTimeout",
    "MissingDependencyError",
    "ObjectNotFoundError",
    "OutputExistsError",
    "ShardFormatError",
    "SourceDataError",
    "StorageError",
    "TruncatedBodyError",
    "UnsafePathError",
]


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose."""


class ConfigError(FastloadError, ValueError):
    """A setting, argument or environment variable has a bad value."""


class MissingDependencyError(FastloadError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package: install it with "
            f"`pip install 'fastload[{extra}]'`"
        )
        self.package = package
        self.extra = extra


class ShardFormatError(FastloadError):
    """A shard, index sidecar or manifest is malformed.

    ``path`` names the file or object; ``offset`` is the byte offset of the
    problem where one is known; ``code`` is the scanner's reason for a tar shard
    (``"truncated"``, ``"refused_member"``, ... see ``fastload.shards.index.ERROR_CODES``),
    ``None`` for other files.
    """

    def __init__(
        self,
        message: str,
        path: str | None = None,
        offset: int | None = None,
        code: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = f"{path}"
            if offset is not None:
                where += f" at byte {offset}"
            where += ": "
        super().__init__(where + message)
        self.path = path
        self.offset = offset
        self.code = code


class IntegrityError(FastloadError):
    """Bytes do not match the size or checksum recorded for them."""


class StorageError(FastloadError):
    """Object storage refused or failed an operation that is not retried."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist; the message names the URL. Not retried."""


class AccessDeniedError(StorageError, PermissionError):
    """The credentials may not read or write the object; names the URL. Not retried."""


class TruncatedBodyError(StorageError):
    """A response body ended before its announced length (retried, and resumed)."""


class LocalS3Error(StorageError):
    """The local SeaweedFS server could not be started (the message has its log tail)."""


class FetchError(StorageError):
    """A read from object storage failed after the retry policy gave up.

    Carries the URL, the number of attempts and the last cause.
    """

    def __init__(self, url: str, attempts: int, cause: BaseException | str) -> None:
        super().__init__(f"fetching {url} failed after {attempts} attempt(s): {cause}")
        self.url = url
        self.attempts = attempts
        self.cause = cause


class CacheError(FastloadError):
    """The local cache could not store or serve an entry."""


class CacheFullError(CacheError):
    """An entry cannot fit in the cache under its byte cap."""


class LockTimeout(CacheError):
    """Waiting for another download of the same entry passed the deadline."""


class LeaseExpired(LockTimeout):
    """The holder of an entry lock stopped beating (stopped or hung) for ``lease_s``."""


class CatalogBusy(CacheError):
    """The catalog's write lock stayed taken past the deadline (by a process stopped
    or hung inside a write transaction)."""


class DecodeError(FastloadError):
    """An image or annotation could not be decoded; names the sample and field."""


class CorruptImageError(DecodeError):
    """An image's bytes are damaged: ``reason`` is ``"truncated"`` (the data ends
    early) or ``"corrupt"`` (the decoder refused them); the message names the image.
    Raised by :func:`fastload.decode.decode_crop`."""

    def __init__(self, message: str, reason: str = "corrupt") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # through DataLoader workers with its reason
        return type(self), (str(self), self.reason)


class SourceDataError(FastloadError):
    """The dataset being converted is broken: a missing or corrupt image, malformed
    JSON, an annotation that refers to an unknown image. ``path`` names the file."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)
        self.reason = message


class OutputExistsError(FastloadError):
    """A conversion's output already holds a dataset (a ``manifest.json``) and
    ``overwrite`` was not asked for; ``url`` names the output."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url}: already holds a dataset (manifest.json); pass overwrite=True "
            "(fastload convert --overwrite) to replace it"
        )
        self.url = url


class UnsafePathError(CacheError):
    """A cache directory or file cannot be trusted: another user owns it, group or
    others may write to it, or it is a symlink. The message names it and the fix
    (see ``docs/security.md``)."""
