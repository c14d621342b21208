"""``ObjectStore``: a root URL in object storage with counted, retried, resumable reads.

One class for every backend. Reads go through the store's :class:`RetryPolicy`; a read
that breaks after N bytes resumes at N. Objects above ``FetchConfig.parallel_threshold``
are downloaded as parallel ranged GETs, each part written at its offset. The store is
thread-safe and fork-safe: the backend (sockets, event loop) is made lazily per process.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from fastload._fs import atomic_write_bytes, atomic_writer
from fastload.config import FetchConfig
from fastload.errors import IntegrityError, StorageError
from fastload.storage.backends import Backend, FsspecBackend, shared_s3_backend
from fastload.storage.retry import ObjectNotFoundError, RetryPolicy, TruncatedBodyError
from fastload.storage.url import (
    S3Settings,
    credential_values,
    is_s3_like,
    join,
    redact_url,
    resolve_s3,
    split_url,
    url_credentials,
)

__all__ = ["ObjectStore", "StoreStats", "open_store"]

# Bytes per body read: each read is one hop to the event-loop thread and back, so
# larger reads cost less; memory per download is concurrency x _CHUNK.
_CHUNK = 4 << 20
_IOV_MAX = 1024  # Linux's limit on buffers per pwritev


@dataclass(frozen=True)
class StoreStats:
    """Counters of one store in this process: requests sent (each attempt counts),
    retries, bytes received and written."""

    requests: int = 0
    retries: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


class _Cancelled(Exception):
    """A part stops because another part of the same download failed."""


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.retries = 0
        self.bytes_read = 0
        self.bytes_written = 0

    def add(self, requests: int = 0, retries: int = 0, read: int = 0, written: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.retries += retries
            self.bytes_read += read
            self.bytes_written += written

    def snapshot(self) -> StoreStats:
        with self.lock:
            return StoreStats(self.requests, self.retries, self.bytes_read, self.bytes_written)


class _Sink:
    """Where a download's bytes go: ``write_at(offset, data)`` from many threads."""

    def __init__(self, dest: BinaryIO | str | os.PathLike[str], size: int) -> None:
        self._lock = threading.Lock()
        self._close_fd = False
        self._file: Any = None
        self._fd = -1
        self.base = 0
        if isinstance(dest, (str, os.PathLike)):
            self._fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            self._close_fd = True
            os.ftruncate(self._fd, size)
            return
        self._file = dest
        self.base = dest.tell()
        try:
            dest.flush()
            self._fd = dest.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = -1

    def write_pieces(self, offset: int, pieces: list[bytes]) -> None:
        """Write ``pieces`` back to back from ``offset``: one ``pwritev`` per batch, so
        the GIL is dropped once per batch rather than once per small network chunk."""
        if self._fd < 0 or not hasattr(os, "pwritev"):
            for data in pieces:
                self.write_at(offset, data)
                offset += len(data)
            return
        views = [memoryview(p) for p in pieces if p]
        pos = self.base + offset
        while views:
            batch = views[:_IOV_MAX]
            n = os.pwritev(self._fd, batch, pos)
            pos += n
            # Drop what was written (whole views, then part of one after a short write).
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]

    @property
    def fd_target(self) -> tuple[int, int] | None:
        """``(fd, base offset)`` when bytes can be ``pwrite``n straight to the file."""
        return (self._fd, self.base) if self._fd >= 0 else None

    def write_at(self, offset: int, data: bytes) -> None:
        if self._fd >= 0:
            view = memoryview(data)
            pos = self.base + offset
            while view:
                n = os.pwrite(self._fd, view, pos)
                view, pos = view[n:], pos + n
        else:
            with self._lock:
                self._file.seek(self.base + offset)
                self._file.write(data)

    def finish(self, size: int) -> None:
        if self._close_fd:
            os.close(self._fd)
        elif self._file is not None:
            self._file.seek(self.base + size)

    def abort(self) -> None:
        if self._close_fd:
            os.close(self._fd)


#: Objects up to this size are downloaded without waiting for a stream slot.
_SMALL_OBJECT = 1 << 20

#: Download GET slots per backend and ``FetchConfig.streams`` (so per endpoint and
#: process: backends are shared, and a forked child makes new ones).
_SLOTS: weakref.WeakKeyDictionary[Any, dict[int, _StreamSlots]] = weakref.WeakKeyDictionary()
_SLOTS_LOCK = threading.Lock()


class _StreamSlots:
    """``n`` GET slots handed out first come, first served: a released slot goes to
    the longest waiter, so the shards the prefetcher asked for first complete first.
    A waiter whose download is cancelled (``cancel`` set, or an exception such as
    KeyboardInterrupt in its thread) leaves the queue, or passes on a slot it was
    handed meanwhile: no slot is ever lost."""

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._free = n
        self._waiters: deque[threading.Event] = deque()

    def acquire(self, cancel: threading.Event | None) -> None:
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return
            granted = threading.Event()
            self._waiters.append(granted)
        try:
            self._wait(granted, cancel)
        except BaseException:
            with self._lock:
                if not granted.is_set():
                    self._waiters.remove(granted)
                    raise
            self.release()  # handed a slot while giving up: pass it on
            raise

    @staticmethod
    def _wait(granted: threading.Event, cancel: threading.Event | None) -> None:
        while not granted.wait(0.5):
            if cancel is not None and cancel.is_set():
                raise _Cancelled

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().set()  # the slot goes straight to the next waiter
            else:
                self._free += 1

    @contextlib.contextmanager
    def hold(self, cancel: threading.Event | None) -> Iterator[None]:
        self.acquire(cancel)
        try:
            yield
        finally:
            self.release()


class ObjectStore:
    """A root URL (``s3://bucket/prefix``, ``cos://…``, ``file:///dir``, ``memory://…``)
    whose objects are read and written by paths relative to it.

    Make one with :func:`open_store`. Reads retry under ``policy`` and count in
    :meth:`stats`. Missing objects raise :class:`ObjectNotFoundError` (a
    :class:`StorageError` and ``FileNotFoundError``) naming the URL; reads that keep
    failing raise :class:`fastload.errors.FetchError`. Credentials never appear in the
    repr or in error messages.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        fetch: FetchConfig | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.fetch = fetch if fetch is not None else FetchConfig()
        self.policy = policy if policy is not None else RetryPolicy(self.fetch.retry)
        self._options = dict(storage_options or {})
        self.protocol, rest = split_url(url)
        self._s3: S3Settings | None = None
        if is_s3_like(url):
            self._s3 = resolve_s3(url, self._options)
            self.root = f"{self.protocol}://{rest}"
            self._root_path = rest
            self._secrets: tuple[str, ...] = self._s3.secrets
        else:
            self.root = f"{self.protocol}://{rest}"
            self._root_path = ""
            self._secrets = ()
        # every credential at any depth of the options, and any embedded in the URL;
        # longest first so a secret containing another is replaced whole
        found = {*self._secrets, *credential_values(self._options), *url_credentials(url)}
        self._secrets = tuple(sorted((s for s in found if len(s) >= 3), key=len, reverse=True))
        self._reset_process_state()

    # -- process-local state -------------------------------------------------------

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._backend: Backend | None = None
        self._counters = _Counters()

    def _get_backend(self) -> Backend:
        if self._pid != os.getpid():
            # After fork: the parent's sockets and event loop are not ours to use.
            self._reset_process_state()
        backend = self._backend
        if backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = self._make_backend()
                backend = self._backend
        return backend

    def _make_backend(self) -> Backend:
        if self._s3 is not None:
            pool = max(32, 4 * self.fetch.concurrency)
            return shared_s3_backend(self._s3, self.fetch.retry, pool)
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.root, **self._options)
        self._root_path = str(root).rstrip("/") if str(root) != "/" else ""
        return FsspecBackend(fs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_backend", "_counters", "_pid"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __repr__(self) -> str:
        return f"ObjectStore({redact_url(self.root)!r})"

    # -- naming ----------------------------------------------------------------------

    def url(self, path: str = "") -> str:
        """The full URL of ``path`` (relative to the store's root)."""
        return join(self.root, path)

    def _path(self, path: str) -> str:
        self._get_backend()  # the fsspec root is known once the filesystem exists
        backend_root = self._s3_root() if self._s3 is not None else self._root_path
        return join(backend_root, path) if path else backend_root

    def _s3_root(self) -> str:
        assert self._s3 is not None
        return f"{self._s3.bucket}/{self._s3.prefix}".rstrip("/")

    def _shown(self, path: str) -> str:
        """The URL of ``path`` as messages show it (credentials redacted)."""
        return self._redact(self.url(path))

    def _redact(self, text: str) -> str:
        text = redact_url(text) if "://" in text and "@" in text else text
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def sub(self, path: str) -> ObjectStore:
        """A store rooted at ``path`` below this one, sharing options, config and policy."""
        return ObjectStore(self.url(path), self._options, self.fetch, self.policy)

    # -- counters --------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """A snapshot of this store's counters in this process."""
        self._get_backend()
        return self._counters.snapshot()

    # -- the retried primitive -------------------------------------------------------

    def _call(self, url: str, fn: Callable[[Backend], Any]) -> Any:
        backend = self._get_backend()
        counters = self._counters

        def attempt(_: int) -> Any:
            counters.add(requests=1)
            return fn(backend)

        return self.policy.call(
            self._redact(url), attempt, on_retry=lambda *_: counters.add(retries=1),
            redact=self._redact,
        )  # fmt: skip

    def _fetch(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Callable[[int, list[bytes]], None],
        *,
        expected_total: int | None = None,
        progress: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
        fd_target: tuple[int, int] | None = None,
        digest: Any = None,
    ) -> int:
        """Stream bytes ``[start, end)`` (to the end if ``end`` is None) of ``path`` into
        ``sink(offset, pieces)``, resuming at the first missing byte after a failure.
        With ``fd_target`` ``(fd, base)`` and a backend stream that can ``pump``, the
        bytes are written at ``base + offset`` of ``fd`` by the stream instead.
        ``digest.update`` is fed every byte in order (a resumed read continues it).
        Returns the end offset actually reached (clamped to the object's size)."""
        url = self._shown(path)  # for messages only
        full = self._path(path)
        backend = self._get_backend()
        counters = self._counters
        pos = start
        stop = end
        direct = self.fetch.direct_reads

        def attempt(_: int) -> int:
            nonlocal pos, stop
            if cancel is not None and cancel.is_set():
                raise _Cancelled
            if stop is not None and pos >= stop:
                return pos
            counters.add(requests=1)
            try:
                stream = backend.open_stream(full, pos, stop, direct=direct)
            finally:
                sent = getattr(backend, "requests_sent", None)
                if sent is not None and sent() > 1:
                    counters.add(requests=sent() - 1)  # a direct GET handed to the client
            try:
                total = stream.total
                if total is not None:
                    if expected_total is not None and total != expected_total:
                        raise IntegrityError(
                            f"{url}: object is {total} bytes, expected {expected_total}"
                        )
                    stop = total if stop is None else min(stop, total)
                while stop is None or pos < stop:
                    if cancel is not None and cancel.is_set():
                        raise _Cancelled
                    pump = getattr(stream, "pump", None) if fd_target is not None else None
                    if pump is not None:
                        assert fd_target is not None
                        # one hop to the loop for the whole rest of the range
                        want = _CHUNK if stop is None else stop - pos
                        got = pump(fd_target[0], fd_target[1] + pos, want, digest)
                        if not got:
                            break
                    else:
                        want = _CHUNK if stop is None else min(_CHUNK, stop - pos)
                        pieces = stream.read_pieces(want)
                        if not pieces:
                            break
                        got = sum(map(len, pieces))
                        sink(pos, pieces)
                        if digest is not None:  # only what was written: a retry resumes
                            for piece in pieces:
                                digest.update(piece)
                    pos += got
                    counters.add(read=got)
                    if progress is not None:
                        progress(got)
                if stop is not None and pos < stop:
                    raise TruncatedBodyError(f"{url}: body ended at byte {pos}, expected {stop}")
            finally:
                stream.close()
            return pos

        return int(
            self.policy.call(
                url, attempt, on_retry=lambda *_: counters.add(retries=1), redact=self._redact
            )
        )

    # -- reads -----------------------------------------------------------------------

    def size(self, path: str) -> int:
        """The size of object ``path`` in bytes. Raises ObjectNotFoundError/FetchError."""
        full = self._path(path)
        return int(self._call(self.url(path), lambda b: b.size(full)))

    def exists(self, path: str) -> bool:
        """Whether object ``path`` exists (a retried ``HEAD``)."""
        try:
            self.size(path)
        except ObjectNotFoundError:
            return False
        return True

    def read(self, path: str) -> bytes:
        """The whole object ``path`` (one streamed GET, resumed after failures)."""
        buf = bytearray()

        def sink(offset: int, pieces: list[bytes]) -> None:
            del buf[offset:]  # a resumed read continues exactly where the last one stopped
            for data in pieces:
                buf.extend(data)

        self._fetch(path, 0, None, sink)
        return bytes(buf)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``path`` (shorter if the object ends first)."""
        if start < 0 or end < start:
            raise StorageError(f"{self._shown(path)}: bad byte range [{start}, {end})")
        if end == start:
            return b""
        buf = bytearray(end - start)
        reached = self._fetch(path, start, end, lambda off, pieces: _put(buf, off - start, pieces))
        if reached < end:
            del buf[max(0, reached - start) :]
        return bytes(buf)

    def download(
        self,
        path: str,
        dest: BinaryIO | str | os.PathLike[str],
        expected_size: int | None = None,
        progress: Callable[[int], None] | None = None,
        digest: Any = None,
    ) -> int:
        """Copy object ``path`` into ``dest`` (a path, or a binary file written from its
        current position) and return the byte count.

        Objects above ``fetch.parallel_threshold`` are read as up to
        ``fetch.concurrency`` parallel ranged GETs of ``fetch.part_size`` bytes, each
        written at its offset (memory stays bounded). ``expected_size`` (from a
        manifest) saves the ``HEAD``; a different real size raises
        :class:`IntegrityError`. ``progress(n)`` is called from worker threads with each
        chunk's size. ``digest`` (an object with ``update(bytes)``, e.g. an
        :class:`~fastload.shards.checksum.Xxh3Hasher`) is fed every byte in order when
        the object is read as one stream, and left untouched when it is read in
        parallel parts: a caller that sees fewer bytes fed than returned hashes the
        file itself.
        """
        size = expected_size if expected_size is not None else self.size(path)
        cfg = self.fetch
        if size <= cfg.parallel_threshold or cfg.concurrency == 1:
            parts = [(0, size)]
        else:
            parts = [(s, min(s + cfg.part_size, size)) for s in range(0, size, cfg.part_size)]
        sink = _Sink(dest, size)
        try:
            if len(parts) == 1:
                # end=None for an empty object: a Range on it would be refused (416).
                end = parts[0][1] or None
                # small objects (index sidecars, manifests) do not queue behind shards:
                # the plan needs them first and they hardly take bandwidth
                small = size <= _SMALL_OBJECT
                with contextlib.nullcontext() if small else self._stream_slots().hold(None):
                    reached = self._fetch(
                        path,
                        0,
                        end,
                        sink.write_pieces,
                        expected_total=size,
                        progress=progress,
                        fd_target=sink.fd_target,
                        digest=digest,
                    )
                if reached != size:
                    raise IntegrityError(
                        f"{self._shown(path)}: object is {reached} bytes, expected {size}"
                    )
            else:
                self._parallel(path, parts, sink, size, progress)
        except BaseException:
            sink.abort()
            raise
        sink.finish(size)
        return size

    def _parallel(
        self,
        path: str,
        parts: list[tuple[int, int]],
        sink: _Sink,
        size: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        cancel = threading.Event()
        workers = min(self.fetch.concurrency, len(parts))
        slots = self._stream_slots()

        def part(*args: Any, **kwargs: Any) -> int:
            with slots.hold(cancel):
                return self._fetch(*args, **kwargs)

        # Parts are submitted a window at a time, not all at once: a size taken from a
        # manifest may be absurd (tests/security/test_fuzz_hostile.py: 22 GB claimed for
        # an 8-byte file), and a future per part would be allocated before the first
        # part found the object short.
        window = 2 * workers
        todo = iter(parts)
        pending: dict[Any, int] = {}
        with ThreadPoolExecutor(workers, thread_name_prefix="fastload-fetch") as pool:
            try:
                while True:
                    while len(pending) < window:
                        nxt = next(todo, None)
                        if nxt is None:
                            break
                        start, end = nxt
                        future = pool.submit(
                            part,
                            path,
                            start,
                            end,
                            sink.write_pieces,
                            expected_total=size,
                            progress=progress,
                            cancel=cancel,
                            fd_target=sink.fd_target,
                        )
                        pending[future] = end
                    if not pending:
                        break
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        end = pending.pop(f)
                        error = f.exception()
                        if error is not None and not isinstance(error, _Cancelled):
                            raise error
                        if error is None and f.result() != end:
                            raise IntegrityError(
                                f"{self._shown(path)}: object is shorter than the expected "
                                f"{size} bytes"
                            )
            finally:
                cancel.set()
                for f in pending:
                    f.cancel()
                wait(pending)

    def _stream_slots(self) -> _StreamSlots:
        """The GET slots of whole-object downloads shared by every store of this
        process on the same backend (``FetchConfig.streams``)."""
        backend = self._get_backend()
        with _SLOTS_LOCK:
            by_count = _SLOTS.setdefault(backend, {})
            slots = by_count.get(self.fetch.streams)
            if slots is None:
                slots = by_count[self.fetch.streams] = _StreamSlots(self.fetch.streams)
            return slots

    # -- writes ----------------------------------------------------------------------

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as object ``path`` (a retried single PUT; atomic on local disk,
        through a ``mkstemp`` file in the target directory)."""
        full = self._path(path)
        if self.protocol == "file":
            self._call(self.url(path), lambda _: _write_local(full, data))
        else:
            self._call(self.url(path), lambda b: b.write_bytes(full, data))
        self._counters.add(written=len(data))

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        """A binary file-like that becomes object ``path`` when the ``with`` block ends
        (multipart upload on S3; on local disk a ``mkstemp`` file in the target directory,
        renamed over ``path`` at the end). Not retried: re-run the whole write on failure."""
        backend = self._get_backend()
        if self.protocol == "file":
            full = self._path(path)
            try:
                os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
                with atomic_writer(full) as f:
                    yield f
                    self._counters.add(written=f.tell())
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"{self._shown(path)}: write failed: {exc}") from exc
            return
        try:
            f = backend.open_write(self._path(path))
        except Exception as exc:
            raise StorageError(
                f"{self._shown(path)}: cannot open for writing: {self._redact(str(exc))}"
            ) from exc
        try:
            with f:
                yield f
                self._counters.add(written=f.tell())
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"{self._shown(path)}: write failed: {self._redact(str(exc))}"
            ) from exc

    def list(self, prefix: str = "") -> list[str]:
        """Names of the objects below ``prefix``, relative to the root, sorted."""
        full = self._path(prefix)
        base = self._path("")
        found = self._call(self.url(prefix), lambda b: b.find(full))
        names = []
        for p in found:
            p = str(p)
            if base and p.lstrip("/").startswith(base.lstrip("/") + "/"):
                p = p.lstrip("/")[len(base.lstrip("/")) + 1 :]
            names.append(p)
        return sorted(names)

    def delete(self, path: str) -> None:
        """Delete object ``path`` (retried)."""
        full = self._path(path)
        self._call(self.url(path), lambda b: b.delete(full))


def _write_local(full: str, data: bytes | bytearray | memoryview) -> None:
    # Never a predictable temp name: ``{path}.tmp-{pid}`` could be a symlink planted by
    # another user, and the write would land wherever it points.
    os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
    atomic_write_bytes(full, data)


def _put(buf: bytearray, offset: int, pieces: list[bytes]) -> None:
    for data in pieces:
        buf[offset : offset + len(data)] = data
        offset += len(data)


def open_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    fetch: FetchConfig | None = None,
    policy: RetryPolicy | None = None,
) -> ObjectStore:
    """Open the object store rooted at ``url``.

    ``s3://``/``cos://`` go through s3fs (``storage_options``: ``key``, ``secret``,
    ``endpoint_url``, ``region``, … — see :func:`fastload.storage.url.resolve_s3`);
    ``file://``, plain paths, ``memory://`` and other fsspec protocols through fsspec
    (``storage_options`` passed to the filesystem). ``fetch`` sets part size and
    concurrency; ``policy`` defaults to ``RetryPolicy(fetch.retry)``. Nothing is
    contacted until the first call. Raises :class:`ConfigError` on a malformed URL and
    :class:`MissingDependencyError` when the protocol's package is absent.
    """
    return ObjectStore(url, storage_options, fetch, policy)
