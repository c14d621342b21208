"""Writing datasets as WebDataset tar shards with index sidecars and a manifest.

Each shard is first written to a local temporary file, then checksummed, indexed
by the C++ scanner (the same code that reads it later, so a shard that cannot be
read is never published) and copied to the destination through
:mod:`fastload.storage` — or, for a local destination, written in the destination
directory and renamed into place, so its bytes are written once. ``manifest.json``
is written last, only when every shard is in place: a dataset whose writing failed
has no manifest and is not readable.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from types import TracebackType
from typing import Any, BinaryIO

from fastload.config import parse_size
from fastload.errors import ConfigError, FastloadError
from fastload.shards.checksum import file_checksum, xxh3_128
from fastload.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo

__all__ = ["ShardWriter", "encode_field", "validate_key"]

_BLOCK = 512
#: Shards are reproducible byte for byte: fixed metadata in every header. Unlike
#: ``tarfile`` the writer does not pad archives to 10 KiB records, which no reader needs.
_MTIME = 0
_COPY_CHUNK = 8 * 2**20


def validate_key(key: object) -> str:
    """Return ``key`` if it is a valid sample key, else raise :class:`ConfigError`.

    Keys are non-empty strings without dots (the first dot of a member's name
    separates key and field) or slashes (which would make directories).
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"sample '__key__' must be a non-empty string, got {key!r}")
    if "." in key or "/" in key or "\\" in key:
        raise ConfigError(
            f"sample key {key!r} must not contain '.', '/' or '\\' (WebDataset splits "
            "member names into key and field at the first dot)"
        )
    if any(ord(c) < 32 for c in key):
        raise ConfigError(f"sample key {key!r} contains control characters")
    return key


def encode_field(key: str, name: str, value: object) -> bytes:
    """Encode one field value: bytes as they are, ``str`` as UTF-8, ``dict``/``list``
    as JSON, ``int`` as its decimal text (the WebDataset ``cls`` convention).

    Raises :class:`ConfigError` naming the sample and field for other types.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"sample {key!r} field {name!r}: not JSON-serialisable ({exc})"
            ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    raise ConfigError(
        f"sample {key!r} field {name!r}: cannot store a {type(value).__name__}; "
        "pass bytes, str, int, or a dict/list (stored as JSON)"
    )


def _header(name: str, size: int) -> bytes:
    """The tar header block(s) of a regular file member: ustar, preceded by a PAX
    extended header when the name is long or not ASCII (as ``tarfile`` writes them)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = _MTIME
    info.mode = 0o444
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def _member_bytes(name: str, size: int) -> int:
    """Bytes a member takes in the tar, headers (PAX for long names) included."""
    header = _BLOCK
    if len(name.encode("utf-8")) > 100 or not name.isascii():
        header += 3 * _BLOCK  # PAX header block + its record block, conservatively
    return header + -(-size // _BLOCK) * _BLOCK


class ShardWriter:
    """Write samples into WebDataset tar shards of about ``shard_size`` bytes.

    ``url`` is the dataset root (``file://``, a plain path, ``s3://``, ``cos://``,
    ``memory://``…); shards ``shard-000000.tar``, … with ``.idx`` sidecars and
    ``manifest.json`` are written there. Use as a context manager; ``close()``
    returns the :class:`Manifest`. On an exception inside the ``with`` block no
    manifest is written. ``source`` is metadata stored in the manifest (``kind``,
    categories, class names, …).
    """

    def __init__(
        self,
        url: str,
        shard_size: int | str = "256MB",
        storage_options: Mapping[str, Any] | None = None,
        source: Mapping[str, Any] | None = None,
        *,
        tmp_dir: str | None = None,
    ) -> None:
        from fastload.storage import open_store

        self.url = str(url)
        self.shard_size = parse_size(shard_size, "shard_size")
        if self.shard_size <= 0:
            raise ConfigError("shard_size must be positive")
        self.source = dict(source or {"kind": "generic"})
        self._store = open_store(self.url, storage_options)
        self._local_root: str | None = None
        if self._store.protocol == "file" and tmp_dir is None:
            self._local_root = self._store.root.removeprefix("file://")
            os.makedirs(self._local_root, exist_ok=True)
        self._tmp_root = tempfile.mkdtemp(
            prefix=".fastload-write-", dir=tmp_dir if tmp_dir is not None else self._local_root
        )
        self._keys: set[str] = set()
        self._fields: set[str] = set()
        self._shards: list[ShardInfo] = []
        self._tar: BinaryIO | None = None
        self._tar_path = ""
        self._shard_samples = 0
        self._shard_bytes = 0
        self._closed = False
        self.manifest: Manifest | None = None

    # ----------------------------------------------------------------- public
    @property
    def samples_written(self) -> int:
        """Samples accepted so far."""
        return len(self._keys)

    @property
    def shards_written(self) -> int:
        """Shards finished and published so far."""
        return len(self._shards)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample ``{"__key__": key, field: value, ...}``.

        Raises :class:`ConfigError` for a missing, malformed or repeated key, a bad
        field name, an unstorable value, or a sample without fields.
        """
        if self._closed:
            raise ConfigError(f"ShardWriter({self.url}) is closed")
        if not isinstance(sample, Mapping):
            raise ConfigError(f"a sample must be a dict, got {type(sample).__name__}")
        key = validate_key(sample.get("__key__"))
        if key in self._keys:
            raise ConfigError(f"duplicate sample key {key!r} in {self.url}")
        members: list[tuple[str, bytes]] = []
        for name, value in sample.items():
            if name.startswith("__") and name.endswith("__"):
                continue  # metadata such as __key__, __url__ (as webdataset does)
            if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
                raise ConfigError(f"sample {key!r}: bad field name {name!r}")
            members.append((f"{key}.{name}", encode_field(key, name, value)))
        if not members:
            raise ConfigError(f"sample {key!r} has no fields")
        size = sum(_member_bytes(n, len(b)) for n, b in members)
        if (
            self._tar is not None
            and self._shard_samples
            and self._shard_bytes + size > self.shard_size
        ):
            self._finish_shard()
        if self._tar is None:
            self._start_shard()
        assert self._tar is not None
        for member_name, data in members:
            self._tar.write(_header(member_name, len(data)))
            self._tar.write(data)
            if pad := -len(data) % _BLOCK:
                self._tar.write(b"\0" * pad)
        self._keys.add(key)
        self._fields.update(n.split(".", 1)[1] for n, _ in members)
        self._shard_samples += 1
        self._shard_bytes += size

    def close(self) -> Manifest:
        """Finish the last shard, write ``manifest.json`` and return the manifest."""
        if self.manifest is not None:
            return self.manifest
        try:
            if self._tar is not None:
                self._finish_shard()
            manifest = Manifest.build(self._shards, self._fields, self.source, url=self.url)
            self._store.write_bytes(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
            self.manifest = manifest
            return manifest
        finally:
            self._closed = True
            self._cleanup()

    def abort(self) -> None:
        """Stop without writing a manifest; temporary files are removed."""
        self._closed = True
        if self._tar is not None:
            self._tar.close()
            self._tar = None
        self._cleanup()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return (
            f"ShardWriter({self.url!r}, shard_size={self.shard_size}, "
            f"samples={self.samples_written}, shards={self.shards_written})"
        )

    # ---------------------------------------------------------------- private
    def _shard_name(self) -> str:
        return f"shard-{len(self._shards):06d}.tar"

    def _start_shard(self) -> None:
        self._tar_path = os.path.join(self._tmp_root, self._shard_name())
        self._tar = open(self._tar_path, "wb")  # noqa: SIM115 - closed in _finish_shard/abort
        self._shard_samples = 0
        self._shard_bytes = 0

    def _finish_shard(self) -> None:
        from fastload.shards.index import ShardIndex

        assert self._tar is not None
        self._tar.write(b"\0" * (2 * _BLOCK))  # end-of-archive marker
        self._tar.close()
        self._tar = None
        name = self._shard_name()
        where = f"{self.url.rstrip('/')}/{name}"
        size, checksum = file_checksum(self._tar_path)
        index = ShardIndex.build(self._tar_path, name=where)
        if index.num_samples != self._shard_samples:
            raise FastloadError(
                f"{where}: wrote {self._shard_samples} samples but the index finds "
                f"{index.num_samples}; this is a bug in fastload"
            )
        index_bytes = index.to_bytes()
        if self._local_root is not None:
            os.replace(self._tar_path, os.path.join(self._local_root, name))
        else:
            self._upload(self._tar_path, name)
            os.unlink(self._tar_path)
        self._store.write_bytes(name + ".idx", index_bytes)
        self._shards.append(
            ShardInfo(
                name=name,
                bytes=size,
                samples=self._shard_samples,
                checksum=checksum,
                index_name=name + ".idx",
                index_bytes=len(index_bytes),
                index_checksum=xxh3_128(index_bytes),
            )
        )

    def _upload(self, local_path: str, name: str) -> None:
        with open(local_path, "rb") as src, self._store.open_write(name) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)

    def _cleanup(self) -> None:
        shutil.rmtree(self._tmp_root, ignore_errors=True)
