"""The shard index: where every member and sample of a tar shard lies.

A :class:`ShardIndex` is a thin view over the serialised ``.idx`` sidecar (see
``csrc/index_format.h`` for the layout): the arrays are numpy views into the
bytes or the mmapped file, and member names are decoded only when asked for.
Scanning and validation run in the C++ core (``fastload._native``) with the GIL
released.

Grouping follows WebDataset: a sample is a run of adjacent members sharing a
key (the path up to the first dot of the basename); the rest is the field.
Members whose basename has no dot, starts with a dot or ends with one, and
top-level ``__*__`` metadata files or ``__*__/`` directories, are not indexed
(webdataset skips the first and last kind too). A key reappearing after other
samples, a field repeated inside a sample, a field starting with ``__``, more
than 4096 fields in one sample, or an archive without its end-of-archive block
(cut short, or empty) is a :class:`~fastload.errors.ShardFormatError`; so are
links, devices, FIFOs, absolute paths, ``..`` components and NULs inside names.
Several extended headers before one member resolve as in ``tarfile`` (the first
name and size win); a global PAX header setting ``path`` or ``size`` is refused.
Each error carries ``code`` (see :data:`ERROR_CODES`). Field names keep their
case (webdataset lower-cases them when it reads).

A shard given by path is read in ``pread`` windows, not mapped, so a file that
shrinks while it is scanned is an error (``code="io"``), not a SIGBUS.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from fastload._fs import atomic_write_bytes
from fastload.errors import MissingDependencyError, ShardFormatError

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType

    from typing_extensions import Buffer

__all__ = ["ERROR_CODES", "ShardIndex"]

PathLike = str | os.PathLike[str]
#: The ``.idx`` and DALI index files that ``save``/``write_dali_index`` write are
#: private to the owner (0600), as the ``mkstemp`` file they were renamed from was.
_MODE = 0o600


def _native() -> ModuleType:
    try:
        from fastload import _native
    except ImportError as exc:  # pragma: no cover - only without a built extension
        raise MissingDependencyError(
            "fastload._native", "all", "indexing shards (the C++ extension; reinstall fastload)"
        ) from exc
    return _native


#: ``ShardFormatError.code`` for each error code of the C++ core (``csrc/tar_scan.h``).
ERROR_CODES: dict[int, str] = {
    1: "truncated",  # EOF inside a header or member data, or no end-of-archive block
    2: "bad_checksum",
    3: "bad_header",
    4: "bad_pax",
    5: "refused_member",  # links, devices, FIFOs, sparse files, global PAX path/size
    6: "unsafe_path",  # absolute, "..", NUL inside a name
    7: "duplicate_key",
    8: "duplicate_field",
    9: "too_large",
    10: "bad_index",
    11: "io",  # the file could not be read, or changed while it was read
    12: "unsupported",
    13: "reserved_field",  # a field name starting with "__"
    14: "too_many_fields",
}


def _format_error(exc: BaseException, name: str) -> ShardFormatError:
    message, offset = exc.args[0], exc.args[1]
    code = ERROR_CODES.get(int(exc.args[2])) if len(exc.args) > 2 else None
    return ShardFormatError(str(message), path=name, offset=int(offset), code=code)


def _call(fn: Callable[[Any], Any], arg: Any, name: str, what: str) -> Any:
    """``fn(arg)``, a function of the C++ core: its ``FormatError`` raised as a
    :class:`ShardFormatError` naming ``name``, a ``BufferError`` (``arg`` is not a
    contiguous buffer) as a ``TypeError`` saying the ``what`` buffer must be."""
    native = _native()
    try:
        return fn(arg)
    except native.FormatError as exc:
        raise _format_error(exc, name) from None
    except BufferError as exc:
        raise TypeError(f"{name}: {what} buffer must be contiguous: {exc}") from None


class ShardIndex:
    """Member and sample table of one tar shard, backed by its ``.idx`` bytes.

    Build one with :meth:`build` (scan a shard), :meth:`load` (mmap a sidecar) or
    :meth:`from_bytes`. ``len(index)`` is the number of samples.
    """

    __slots__ = (
        "_buffer",
        "_name_offsets",
        "_names",
        "_names_blob",
        "_sample_count",
        "_sample_first",
        "name",
        "num_members",
        "num_samples",
        "offsets",
        "shard_size",
        "sizes",
    )

    def __init__(self, buffer: Buffer, name: str) -> None:
        """Wrap a serialised index (validated first); prefer the constructors below.

        Raises ShardFormatError if ``buffer`` is not a valid index.
        """
        layout = _call(_native().validate_index, buffer, name, "index")
        m = layout["num_members"]
        s = layout["num_samples"]
        self._buffer = buffer
        self.name = name
        self.num_members: int = m
        self.num_samples: int = s
        self.shard_size: int = layout["shard_size"]
        self.offsets: np.ndarray = self._view(buffer, "<u8", m, layout["offsets_at"])
        self.sizes: np.ndarray = self._view(buffer, "<u8", m, layout["sizes_at"])
        self._name_offsets: np.ndarray = self._view(buffer, "<u8", m + 1, layout["name_offsets_at"])
        self._sample_first: np.ndarray = self._view(buffer, "<u8", s, layout["sample_first_at"])
        self._sample_count: np.ndarray = self._view(buffer, "<u4", s, layout["sample_count_at"])
        self._names_blob = memoryview(buffer).cast("B")[
            layout["names_at"] : layout["names_at"] + layout["names_bytes"]
        ]
        self._names: list[str] | None = None

    @staticmethod
    def _view(buffer: Buffer, dtype: str, count: int, offset: int) -> np.ndarray:
        arr = np.frombuffer(memoryview(buffer), dtype=dtype, count=count, offset=offset)
        arr.flags.writeable = False
        return arr

    # construction -------------------------------------------------------------

    @classmethod
    def build(cls, path_or_buffer: PathLike | Buffer, name: str | None = None) -> ShardIndex:
        """Scan a tar shard and index it.

        ``path_or_buffer`` is a local path (read by the C++ core in ``pread``
        windows, headers only, never whole) or any contiguous buffer (bytes,
        memoryview, mmap, numpy uint8), which is not copied. ``name`` names the
        shard in error messages (default: the path, or ``"<buffer>"``). Raises
        ShardFormatError for a malformed or refused archive and OSError if the path
        cannot be opened.
        """
        native = _native()
        if isinstance(path_or_buffer, str | os.PathLike):
            label = name if name is not None else os.fspath(path_or_buffer)
            data = _call(native.build_index_file, os.fsencode(path_or_buffer), label, "shard")
        else:
            label = name if name is not None else "<buffer>"
            data = _call(native.build_index, path_or_buffer, label, "shard")
        return cls(data, label)

    @classmethod
    def load(cls, path: PathLike) -> ShardIndex:
        """Map a ``.idx`` sidecar and validate it in place (the arrays are views of the map).

        Raises ShardFormatError if the file is not a valid index, OSError if it
        cannot be opened.
        """
        label = os.fspath(path)
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ShardFormatError("index file is empty", path=label, offset=0)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return cls(mm, label)

    @classmethod
    def for_shard(cls, path: PathLike) -> ShardIndex:
        """The index of the local shard ``path``: its ``<path>.idx`` sidecar if there is
        one that describes a file of this size, else a fresh scan.

        Raises ShardFormatError naming the sidecar if it is stale (it describes a
        shard of another size: the shard was cut or rewritten after indexing), and
        what :meth:`build` raises.
        """
        label = os.fspath(path)
        sidecar = label + ".idx"
        if not os.path.exists(sidecar):
            return cls.build(label)
        index = cls.load(sidecar)
        size = os.path.getsize(label)
        if index.shard_size != size:
            raise ShardFormatError(
                f"stale index: it describes a shard of {index.shard_size} bytes but "
                f"{label} has {size} bytes (re-run `fastload index`)",
                path=sidecar,
            )
        return index

    @classmethod
    def from_bytes(cls, data: Buffer, name: str = "<bytes>") -> ShardIndex:
        """Wrap serialised index bytes (any contiguous buffer; not copied).

        Raises ShardFormatError if they are not a valid index.
        """
        return cls(data, name)

    # serialisation --------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The serialised index (the ``.idx`` file's contents)."""
        return bytes(self._buffer)

    def save(self, path: PathLike) -> None:
        """Write the ``.idx`` sidecar atomically (temp file in the same directory, then rename)."""
        atomic_write_bytes(path, memoryview(self._buffer).cast("B"), _MODE)

    def write_dali_index(self, path: PathLike) -> None:
        """Write the index in DALI's ``fn.readers.webdataset`` format (as ``wds2idx`` does).

        Raises ShardFormatError if a member name contains whitespace, which that
        text format cannot hold.
        """
        text = _call(_native().dali_index, self._buffer, self.name, "index")
        atomic_write_bytes(path, text, _MODE)

    # access ------------------------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        # An mmap cannot be pickled; the index bytes are small, so send those.
        return (ShardIndex.from_bytes, (self.to_bytes(), self.name))

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"ShardIndex({self.name!r}, samples={self.num_samples}, "
            f"members={self.num_members}, shard_size={self.shard_size})"
        )

    @property
    def names(self) -> list[str]:
        """Member paths in archive order (decoded once, on first use)."""
        if self._names is None:
            blob = bytes(self._names_blob)
            bounds = self._name_offsets.tolist()
            self._names = [
                blob[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(bounds)
            ]
        return self._names

    def _member_name(self, m: int) -> str:
        if self._names is not None:
            return self._names[m]
        a = int(self._name_offsets[m])
        b = int(self._name_offsets[m + 1])
        return bytes(self._names_blob[a:b]).decode("utf-8", "surrogateescape")

    def _check(self, i: int) -> int:
        n = self.num_samples
        if not -n <= i < n:
            raise IndexError(f"{self.name}: sample {i} out of range (shard has {n} samples)")
        return i + n if i < 0 else i

    def members(self, i: int) -> range:
        """Member numbers (into ``offsets``/``sizes``/``names``) of sample ``i``."""
        i = self._check(i)
        first = int(self._sample_first[i])
        return range(first, first + int(self._sample_count[i]))

    def key(self, i: int) -> str:
        """The WebDataset key of sample ``i``. Raises IndexError out of range."""
        name = self._member_name(self.members(i).start)
        return name[: _dot(name)]

    def fields(self, i: int) -> list[str]:
        """Field names of sample ``i`` in archive order (``["jpg", "json"]``)."""
        out = []
        for m in self.members(i):
            name = self._member_name(m)
            out.append(name[_dot(name) + 1 :])
        return out

    def sample(self, i: int) -> dict[str, Any]:
        """``{"__key__": key, field: (offset, size), ...}`` for sample ``i``.

        Offsets are absolute data offsets in the shard. Raises IndexError out of range.
        """
        members = self.members(i)
        out: dict[str, Any] = {}
        for m in members:
            name = self._member_name(m)
            dot = _dot(name)
            if not out:
                out["__key__"] = name[:dot]
            out[name[dot + 1 :]] = (int(self.offsets[m]), int(self.sizes[m]))
        return out

    def sample_range(self, i: int) -> tuple[int, int]:
        """``(start, end)`` byte span covering the data of every field of sample ``i``.

        One ranged read of this span serves the whole sample.
        """
        members = self.members(i)
        last = members.stop - 1
        return int(self.offsets[members.start]), int(self.offsets[last] + self.sizes[last])

    @property
    def sample_first(self) -> np.ndarray:
        """First member number of every sample (uint64 view)."""
        return self._sample_first

    @property
    def sample_count(self) -> np.ndarray:
        """Member count of every sample (uint32 view)."""
        return self._sample_count


def _dot(name: str) -> int:
    return name.index(".", name.rfind("/") + 1)
