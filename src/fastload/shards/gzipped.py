"""Gzipped shards (``.tar.gz``, ``.tgz``): streamed out of object storage and
decompressed once, into whatever file the caller gives (the node cache's temp file).

A gzipped shard's manifest entry names the compressed object, records the
decompressed bytes' size and checksum in ``bytes``/``checksum`` (what the cache
stores, verifies and maps; what the ``.idx`` sidecar describes) and the compressed
object's in ``compressed_bytes``/``compressed_checksum``. :func:`fetch_shard` is
what :class:`fastload.datasets.source.ShardSource` fetches every object with
(:func:`shard_fetcher` wraps it as the cache's ``fetch(f)``): a plain download, or
for a gzipped shard a pipelined sequence of ranged reads fed through :mod:`zlib` and
written to the destination as it decompresses, so neither the compressed nor the
decompressed shard is ever held in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from fastload.errors import IntegrityError, ShardFormatError
from fastload.shards.checksum import Xxh3Hasher

__all__ = [
    "GZIP_SUFFIXES",
    "Decompressed",
    "decompress_stream",
    "fetch_shard",
    "is_gzip_name",
    "read_chunks",
    "shard_fetcher",
]

#: Object names read as gzipped tar shards.
GZIP_SUFFIXES = (".tar.gz", ".tgz")
_RANGE = 8 << 20  # bytes per ranged GET of a compressed shard
_AHEAD = 2  # ranged GETs in flight ahead of the decompressor
_OUT = 4 << 20  # largest decompressed piece written at once


def is_gzip_name(name: str) -> bool:
    """Whether the object ``name`` is a gzipped shard (by its suffix)."""
    return name.lower().endswith(GZIP_SUFFIXES)


class Decompressed:
    """What :func:`decompress_stream` saw: sizes and checksums of both sides."""

    __slots__ = ("compressed", "decompressed")

    def __init__(self) -> None:
        self.compressed = Xxh3Hasher()
        self.decompressed = Xxh3Hasher()

    @property
    def compressed_bytes(self) -> int:
        """Bytes of the gzip stream."""
        return self.compressed.nbytes

    @property
    def bytes(self) -> int:
        """Bytes after decompression."""
        return self.decompressed.nbytes


def decompress_stream(
    chunks: Iterator[bytes], write: Callable[[bytes], Any], name: str
) -> Decompressed:
    """Decompress the gzip stream arriving as ``chunks`` and ``write`` it piecewise.

    Concatenated gzip members (``cat a.gz b.gz``) decompress to the concatenation, as
    ``gzip -d`` does. Returns the sizes and checksums of both sides. Raises
    :class:`ShardFormatError` naming ``name`` for data that is not gzip, is corrupt
    or ends early.
    """
    seen = Decompressed()
    d = zlib.decompressobj(wbits=31)
    in_member = False
    for chunk in chunks:
        seen.compressed.update(chunk)
        data = chunk
        while data or in_member:
            if not in_member:
                d = zlib.decompressobj(wbits=31)
                in_member = True
            try:
                out = d.decompress(data, _OUT)
            except zlib.error as exc:
                raise ShardFormatError(f"not a valid gzip stream ({exc})", name) from None
            if out:
                seen.decompressed.update(out)
                write(out)
            if d.eof:
                in_member = False
                data = d.unused_data
                continue
            data = d.unconsumed_tail
            if not data and not out:
                break  # this member needs more input
    if in_member or seen.compressed_bytes == 0:
        raise ShardFormatError(
            "gzip stream ends early (truncated object)", name, seen.compressed_bytes
        )
    return seen


def read_chunks(store: Any, name: str) -> Iterator[bytes]:
    """Object ``name`` of ``store`` as successive ranged reads (one ``HEAD`` first)."""
    return _ranges(store, name, store.size(name))


def _ranges(store: Any, name: str, size: int) -> Iterator[bytes]:
    """Bytes ``[0, size)`` of object ``name`` as ranged reads, ``_AHEAD`` in flight."""
    starts = list(range(0, size, _RANGE))
    with ThreadPoolExecutor(1, thread_name_prefix="fastload-gunzip") as pool:
        pending: list[Future[bytes]] = []
        try:
            for k, start in enumerate(starts):
                while len(pending) < _AHEAD and k + len(pending) < len(starts):
                    s = starts[k + len(pending)]
                    pending.append(pool.submit(store.read_range, name, s, min(s + _RANGE, size)))
                data = pending.pop(0).result()
                if len(data) != min(_RANGE, size - start):
                    raise IntegrityError(
                        f"{store.url(name)}: object ended at byte {start + len(data)}, "
                        f"expected {size}"
                    )
                yield data
        finally:
            for f in pending:
                f.cancel()


def fetch_shard(
    store: Any,
    name: str,
    dest: BinaryIO,
    size: int | None = None,
    compressed_size: int | None = None,
    compressed_checksum: str | None = None,
    digest: Any = None,
) -> int:
    """Copy object ``name`` of ``store`` into ``dest``, decompressed if it is gzipped.

    ``size`` is the expected byte count written (the decompressed size for a
    gzipped shard); a different count raises :class:`IntegrityError`, as does a
    compressed object whose size or checksum differs from ``compressed_size`` /
    ``compressed_checksum`` when given. Returns the bytes written. ``digest.update``
    is fed the bytes written, in order, where they are written as one stream (see
    :meth:`~fastload.storage.store.ObjectStore.download`).
    """
    if not is_gzip_name(name):
        return int(store.download(name, dest, expected_size=size, digest=digest))
    where = store.url(name)
    write: Callable[[bytes], Any] = dest.write
    if digest is not None:

        def write(data: bytes) -> Any:
            digest.update(data)
            return dest.write(data)

    seen = decompress_stream(read_chunks(store, name), write, where)
    if compressed_size is not None and seen.compressed_bytes != compressed_size:
        raise IntegrityError(
            f"{where}: object is {seen.compressed_bytes} bytes, expected {compressed_size}"
        )
    if compressed_checksum and seen.compressed.hexdigest_tagged() != compressed_checksum:
        raise IntegrityError(
            f"{where}: checksum is {seen.compressed.hexdigest_tagged()}, "
            f"expected {compressed_checksum}"
        )
    if size is not None and seen.bytes != size:
        raise IntegrityError(f"{where}: decompresses to {seen.bytes} bytes, expected {size}")
    return seen.bytes


def shard_fetcher(store: Any, name: str, size: int) -> Callable[[BinaryIO], Xxh3Hasher]:
    """The cache's ``fetch(f)`` for object ``name`` of ``store`` expected to yield
    ``size`` bytes: :func:`fetch_shard` into ``f``, returning the checksum of what it
    wrote as it wrote it (the cache hashes the file itself if it was not fed whole)."""

    def fetch(f: BinaryIO) -> Xxh3Hasher:
        digest = Xxh3Hasher()
        fetch_shard(store, name, f, size, digest=digest)
        return digest

    return fetch
