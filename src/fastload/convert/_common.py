"""What every image converter shares: parallel ordered reads and image verification;
the error policy, the report and the progress bar (:mod:`fastload.shards.report`,
shared with the text converter) are re-exported here."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from fastload.config import default_workers as _default_workers
from fastload.decode.image import open_image
from fastload.errors import (
    ConfigError,
    DecodeError,
    MissingDependencyError,
    SourceDataError,
)
from fastload.shards.report import (
    ConvertReport,
    ErrorPolicy,
    SkippedItem,
    finish,
    progress_bar,
)

__all__ = [
    "ConvertReport",
    "ErrorPolicy",
    "SkippedItem",
    "SourceDataError",
    "default_workers",
    "finish",
    "image_field",
    "progress_bar",
    "read_image",
    "read_json_file",
    "read_ordered",
    "read_source_file",
]

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """Reader threads by default: reading and PIL decoding release the GIL."""
    return _default_workers("convert")


def read_ordered(
    items: Iterable[T], fn: Callable[[T], R], workers: int, window: int | None = None
) -> Generator[tuple[T, R | SourceDataError], None, None]:
    """Apply ``fn`` to ``items`` on ``workers`` threads and yield ``(item, result)`` in
    input order; a :class:`SourceDataError` raised by ``fn`` is yielded as the result.

    At most ``window`` (default ``4 * workers``) results are in flight, so memory
    stays bounded however large the dataset.
    """
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    window = window or 4 * workers
    pending: deque[tuple[T, Future[R | SourceDataError]]] = deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastload-convert") as pool:
        try:
            for item in items:
                pending.append((item, pool.submit(_guarded, fn, item)))
                if len(pending) >= window:
                    done, fut = pending.popleft()
                    yield done, fut.result()
            while pending:
                done, fut = pending.popleft()
                yield done, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()


def _guarded(fn: Callable[[T], R], item: T) -> R | SourceDataError:
    try:
        return fn(item)
    except SourceDataError as exc:
        return exc


def read_image(path: str, verify: bool = True) -> tuple[bytes, str]:
    """Return the bytes of the image file ``path`` and its format (``"JPEG"``, ``"PNG"``…).

    With ``verify`` the image is fully decoded by Pillow, so truncated or corrupt
    files are caught at conversion time. Raises :class:`SourceDataError` naming the
    file if it is missing, unreadable or not a decodable image.
    """
    data = read_source_file(path, "image file")
    return data, image_format(data, path, verify)


def read_source_file(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The bytes of the input file ``path`` (``what`` names it in the error).

    Raises :class:`SourceDataError` naming the file if it is missing or unreadable.
    """
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SourceDataError(f"{what} is missing", path) from None
    except OSError as exc:
        raise SourceDataError(f"cannot read {what} ({exc.strerror or exc})", path) from None


def image_format(data: bytes, path: str, verify: bool = True) -> str:
    """Return the Pillow format name of the encoded image ``data`` read from ``path``.

    Raises :class:`SourceDataError` if Pillow cannot identify it or (with
    ``verify``) cannot decode all of it.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is in the image extra
        raise MissingDependencyError(
            "Pillow", "image", "checking images while converting"
        ) from None
    try:
        # One decode entry point: its formats only, its pixel cap. Decoding a JPEG at
        # 1/8 scale still runs the whole entropy-coded stream, so truncated or corrupt
        # data fail as in a full decode, several times faster.
        img = open_image(data, draft_size=(1, 1) if verify else None, load=verify, name=path)[0]
        fmt = str(img.format or "")
    except DecodeError as exc:
        if isinstance(exc.__cause__, UnidentifiedImageError):
            raise SourceDataError("not an image Pillow can identify", path) from None
        if isinstance(exc.__cause__, Image.DecompressionBombError):
            raise SourceDataError(f"image refused ({exc})", path) from None
        raise SourceDataError(f"corrupt image ({exc})", path) from None
    return fmt


def read_json_file(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Read and parse the JSON file ``path``.

    Raises :class:`SourceDataError` naming the file (and line and column for a
    syntax error) if it is missing, unreadable or malformed.
    """
    return parse_json(read_source_file(path, what), path, what)


def parse_json(data: bytes, path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Parse JSON ``data`` read from ``path``; see :func:`read_json_file`."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise SourceDataError(
            f"malformed {what}: {exc.msg} at line {exc.lineno} column {exc.colno}", path
        ) from None
    except UnicodeDecodeError as exc:
        raise SourceDataError(f"malformed {what}: not UTF-8 text ({exc.reason})", path) from None


def image_field(file_name: str, fmt: str) -> str:
    """The field name for an image: its file extension lower-cased (``jpg``, ``png``), or,
    for a file without one, a name from its Pillow format (``JPEG`` -> ``jpg``)."""
    ext = os.path.splitext(os.path.basename(file_name))[1][1:].lower()
    if ext:
        return ext
    return {"JPEG": "jpg"}.get(fmt, fmt.lower() or "img")
