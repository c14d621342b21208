"""Reading a local shard: samples as ``memoryview`` slices of an mmap (zero-copy), or
with ``mapped=False`` as ``bytes`` read by ``pread`` (for files that may change).

A mapped reader checks the file's size before it hands out each sample: a file that
shrank since it was opened is a :class:`ShardFormatError`, not a SIGBUS."""

from __future__ import annotations

import contextlib
import mmap
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fastload.errors import ShardFormatError

if TYPE_CHECKING:
    from fastload.shards.index import ShardIndex

__all__ = ["ShardReader"]


class ShardReader:
    """Read samples of a local tar shard without copying.

    ``index`` defaults to the ``<path>.idx`` sidecar if present, else it is built
    by scanning the shard. ``reader[i]`` returns ``{"__key__": key, field:
    memoryview, ...}``; the views stay valid until :meth:`close` (release them
    before closing, or keep the reader open while they are used).

    A mapped file that shrinks under a reader would kill the process with SIGBUS (the
    kernel's answer to touching a page past the end of a file): so before each sample
    the reader checks (``fstat``) that the file still has the size it was opened with,
    and raises :class:`ShardFormatError` (``code="io"``) if not. Views already handed
    out are not re-checked: keep mapping only files nothing else changes, such as the
    cache's (published read-only, never truncated, only unlinked). With
    ``mapped=False`` fields are read with ``os.pread`` into ``bytes`` instead, and a
    file that changed is a :class:`ShardFormatError` as well.

    Raises :class:`ShardFormatError` if the index does not describe this file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        index: ShardIndex | None = None,
        *,
        mapped: bool = True,
    ) -> None:
        from fastload.shards.index import ShardIndex

        self.path = os.fspath(path)
        if index is None:
            index = ShardIndex.for_shard(self.path)
        self.index = index
        self.mapped = mapped
        self._fd = -1
        self._mmap: mmap.mmap | None = None
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != index.shard_size:
                raise ShardFormatError(
                    f"index describes a shard of {index.shard_size} bytes but the file has "
                    f"{size} bytes",
                    self.path,
                )
            self._fd = os.dup(f.fileno())
            if mapped and size:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._mmap) if self._mmap is not None else memoryview(b"")

    def __len__(self) -> int:
        return self.index.num_samples

    def sample(self, i: int) -> dict[str, Any]:
        """Return sample ``i`` as ``{"__key__": key, field: memoryview}`` (``bytes`` when
        not ``mapped``)."""
        entry = self.index.sample(i)
        out: dict[str, Any] = {"__key__": str(entry["__key__"])}
        view = self._view
        if self.mapped and self._fd >= 0:
            size = os.fstat(self._fd).st_size
            if size < self.index.shard_size:
                raise ShardFormatError(
                    f"the file shrank to {size} bytes since it was opened (it had "
                    f"{self.index.shard_size}): sample {out['__key__']!r} is not read",
                    self.path,
                    size,
                    code="io",
                )
        for field, span in entry.items():
            if field == "__key__":
                continue
            assert isinstance(span, tuple)
            offset, size = span
            if not self.mapped:
                data = os.pread(self._fd, size, offset)
                if len(data) != size:
                    raise ShardFormatError(
                        f"the file changed since it was opened: field {field!r} of sample "
                        f"{out['__key__']!r} ends past the end of the file",
                        self.path,
                        offset + len(data),
                        code="io",
                    )
                out[field] = data
            else:
                out[field] = view[offset : offset + size]
        return out

    __getitem__ = sample

    def close(self) -> None:
        """Release the mapping. Views handed out must have been released."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._view.release()
        if self._mmap is not None:
            # Slices still alive keep the mapping; it is freed with the last one.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardReader({self.path!r}, samples={len(self)})"
