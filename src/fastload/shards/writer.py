"""Writing datasets as WebDataset tar shards with index sidecars and a manifest.

Each shard is first written to a local temporary file, then checksummed, indexed
by the C++ scanner (the same code that reads it later, so a shard that cannot be
read is never published) and copied to the destination through
:mod:`fastload.storage` — or, for a local destination, written in the destination
directory and renamed into place, so its bytes are written once. ``manifest.json``
is written last, only when every shard is in place: a dataset whose writing failed
has no manifest and is not readable.

Writing over an existing dataset is safe: it is refused unless ``overwrite=True``;
new shards get a fresh name prefix (a generation) that no object of the output
already starts with, so the live dataset's shards are never touched; the new
manifest replaces the old one in one atomic write, and only then are the old
generation's shards and sidecars deleted. A writer that fails or is interrupted
deletes the shards it had published, so the output lists exactly what it listed
before (if a deletion fails, the error names what is left). Interrupts (SIGINT)
that arrive while the manifest is published or the cleanup runs are held back
until it is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import tarfile
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType, TracebackType
from typing import Any, BinaryIO

from fastload.config import parse_size
from fastload.errors import ConfigError, FastloadError, OutputExistsError, StorageError
from fastload.shards.checksum import file_checksum
from fastload.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, indexed_shard

__all__ = [
    "ShardWriter",
    "defer_interrupts",
    "delete_objects",
    "drop_previous",
    "encode_field",
    "generation_prefix",
    "previous_dataset",
    "validate_key",
]

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


@contextlib.contextmanager
def defer_interrupts() -> Iterator[None]:
    """Hold back SIGINT (``KeyboardInterrupt``) for the ``with`` block, then deliver it.

    Used around the steps that must not stop half-way (publishing a manifest, deleting
    a failed run's shards). Outside the main thread, where Python never delivers
    signals, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def previous_dataset(store: Any, url: str, overwrite: bool) -> tuple[bool, Manifest | None]:
    """Whether ``store`` holds a ``manifest.json``, and its parsed form (None if unreadable).

    Raises :class:`OutputExistsError` naming ``url`` when it does and ``overwrite`` is
    false.
    """
    from fastload.errors import ShardFormatError

    try:
        text = store.read(MANIFEST_NAME)
    except FileNotFoundError:
        return False, None
    if not overwrite:
        raise OutputExistsError(url)
    try:
        return True, Manifest.from_json(text, url)
    except ShardFormatError:
        return True, None  # replaced anyway; its shards are not known, so none are deleted


def drop_previous(store: Any, url: str, manifest: Manifest, previous: Manifest | None) -> list[str]:
    """After ``manifest`` replaced ``previous`` in ``store``: delete the old dataset's
    shards and sidecars that the new one does not list. Returns (and warns about) the
    names that could not be deleted; the new dataset is complete either way."""
    if previous is None:
        return []
    keep = {n for s in manifest.shards for n in (s.name, s.index_name)}
    old = [n for s in previous.shards for n in (s.name, s.index_name) if n not in keep]
    left = delete_objects(store, old)
    if left:
        warnings.warn(
            f"{url}: the new dataset is in place but these files of the one it "
            f"replaced could not be deleted: {', '.join(left)}",
            stacklevel=2,
        )
    return left


def delete_objects(store: Any, names: Iterable[str]) -> list[str]:
    """Delete ``names`` from ``store``; return those that could not be deleted (a
    missing one counts as deleted)."""
    left = []
    for name in names:
        try:
            store.delete(name)
        except FileNotFoundError:
            pass
        except Exception:  # reported to the caller by name
            left.append(name)
    return left


def generation_prefix(existing: Iterable[str], base: str = "shard-") -> str:
    """A shard name prefix that no name in ``existing`` starts with: ``base`` itself on
    an output without such names, else ``base`` plus a fresh random generation tag."""
    names = list(existing)

    def free(prefix: str) -> bool:
        return not any(os.path.basename(n).startswith(prefix) for n in names)

    if free(base):
        return base
    while True:
        prefix = f"{base}{secrets.token_hex(4)}-"
        if free(prefix):
            return prefix


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
    manifest is written and the shards already published are deleted. ``source`` is
    metadata stored in the manifest (``kind``, categories, class names, …).

    An output that already holds a ``manifest.json`` is refused with
    :class:`OutputExistsError` unless ``overwrite``; then the old dataset stays
    readable until the new manifest replaces it, and its shards are deleted after
    (see the module docstring). ``name_prefix`` forces the shard name prefix (the
    Ray executor gives each task its own); by default it is chosen by
    :func:`generation_prefix`. ``publish=False`` writes shards and sidecars but no
    manifest (``close()`` still returns the manifest the shards make).
    """

    def __init__(
        self,
        url: str,
        shard_size: int | str = "256MB",
        storage_options: Mapping[str, Any] | None = None,
        source: Mapping[str, Any] | None = None,
        *,
        tmp_dir: str | None = None,
        overwrite: bool = False,
        name_prefix: str | None = None,
        publish: bool = True,
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
        self._tmp_dir = tmp_dir
        self._tmp_root = ""  # made with the first shard, so that nothing is left behind early
        self._publish = publish
        if publish:
            self._replaces, self._previous = previous_dataset(self._store, self.url, overwrite)
        else:
            self._replaces, self._previous = False, None
        if name_prefix is None:
            name_prefix = generation_prefix(self._existing_names())
        self._prefix = name_prefix
        self._created_root = False
        self._published: list[str] = []
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

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """The shards finished and published so far."""
        return tuple(self._shards)

    def close(self) -> Manifest:
        """Finish the last shard, write ``manifest.json`` (atomically replacing an old
        one), delete the replaced dataset's shards and return the manifest.

        If anything fails (or is interrupted) before the manifest is in place, the
        shards this writer published are deleted, as in :meth:`abort`.
        """
        if self.manifest is not None:
            return self.manifest
        published = False
        try:
            if self._tar is not None:
                self._finish_shard()
            manifest = Manifest.build(self._shards, self._fields, self.source, url=self.url)
            with defer_interrupts():
                if self._publish:
                    self._ensure_root()
                    self._store.write_bytes(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
                published = True  # the new dataset is in place: nothing is discarded now
                self.manifest = manifest
                if self._publish:
                    drop_previous(self._store, self.url, manifest, self._previous)
            return manifest
        except BaseException:
            if not published:
                self._discard()
            raise
        finally:
            self._closed = True
            self._cleanup()

    def abort(self) -> None:
        """Stop without writing a manifest: temporary files and the shards this writer
        already published are removed, so the output is as it was before.

        Raises :class:`StorageError` naming the objects that could not be deleted.
        """
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        with defer_interrupts():
            if self._tar is not None:
                self._tar.close()
                self._tar = None
            self._cleanup()
            left = self._delete(self._published)
            self._published = []
            self._shards = []
            if self._created_root and self._local_root is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(self._local_root)  # only if empty: it did not exist before
        if left:
            raise StorageError(
                f"{self.url}: the failed write could not delete its partial shard files: "
                + ", ".join(left)
            )

    def _delete(self, names: list[str]) -> list[str]:
        return delete_objects(self._store, names)

    def _existing_names(self) -> list[str]:
        try:
            return self._store.list()
        except FileNotFoundError:
            return []

    def _ensure_root(self) -> None:
        if self._local_root is not None and not os.path.isdir(self._local_root):
            os.makedirs(self._local_root, exist_ok=True)
            self._created_root = True

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
        return f"{self._prefix}{len(self._shards):06d}.tar"

    def _start_shard(self) -> None:
        self._ensure_root()
        if not self._tmp_root:
            directory = self._tmp_dir if self._tmp_dir is not None else self._local_root
            with defer_interrupts():
                self._tmp_root = tempfile.mkdtemp(prefix=".fastload-write-", dir=directory)
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
        # Recorded before they exist, so that a failure at any point deletes them.
        self._published += [name, name + ".idx"]
        if self._local_root is not None:
            # Both files are complete in the temporary directory first: an interrupt
            # leaves whole files (deleted by abort) or none, never a partial one.
            idx_tmp = self._tar_path + ".idx"
            with open(idx_tmp, "wb") as f:
                f.write(index_bytes)
            os.replace(self._tar_path, os.path.join(self._local_root, name))
            os.replace(idx_tmp, os.path.join(self._local_root, name + ".idx"))
        else:
            self._upload(self._tar_path, name)
            os.unlink(self._tar_path)
            self._store.write_bytes(name + ".idx", index_bytes)
        self._shards.append(indexed_shard(name, size, self._shard_samples, checksum, index_bytes))

    def _upload(self, local_path: str, name: str) -> None:
        with open(local_path, "rb") as src, self._store.open_write(name) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)

    def _cleanup(self) -> None:
        if self._tmp_root:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            self._tmp_root = ""
