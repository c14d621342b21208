"""The two ways fastload talks to storage: the aiobotocore client under s3fs, or fsspec.

A backend does single requests and nothing else (no retries, no counting): the
:class:`~fastload.storage.store.ObjectStore` wraps every call in its retry policy.
Paths given to a backend are absolute within it (``bucket/key`` for S3, the fsspec
path otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import IO, Any, Protocol, TypeVar, cast

from fastload.config import RetryConfig
from fastload.errors import MissingDependencyError
from fastload.storage.direct import (
    DirectGet,
    UseClient,
    ca_bundle,
    proxy_configured,
    write_all,
)
from fastload.storage.retry import TruncatedBodyError
from fastload.storage.url import S3Settings

__all__ = [
    "Backend",
    "ByteStream",
    "FsspecBackend",
    "S3Backend",
    "make_s3_filesystem",
    "shared_s3_backend",
]

T = TypeVar("T")


class ByteStream(Protocol):
    """An open response body: ``total`` is the whole object's size where the response
    says so; ``read_pieces(n)`` returns up to ``n`` bytes as a list of pieces (empty at
    the end) — pieces, so bytes are not joined (copied) only to be written elsewhere."""

    total: int | None

    def read_pieces(self, n: int) -> list[bytes]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """One request per call; errors are raised as the client library raises them."""

    def size(self, path: str) -> int: ...

    def open_stream(
        self, path: str, start: int, end: int | None, direct: bool = False
    ) -> ByteStream: ...

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> None: ...

    def open_write(self, path: str) -> IO[bytes]: ...

    def find(self, path: str) -> list[str]: ...

    def delete(self, path: str) -> None: ...


def make_s3_filesystem(settings: S3Settings, retry: RetryConfig, pool: int) -> Any:
    """A fresh ``s3fs.S3FileSystem`` for ``settings`` with botocore's and s3fs's own
    retries off (the fastload policy counts and retries) and socket timeouts from
    ``retry.timeout_s``. Raises :class:`MissingDependencyError` without s3fs."""
    try:
        import s3fs
    except ImportError as exc:
        raise MissingDependencyError("s3fs", "s3", f"reading {settings.protocol}:// URLs") from exc
    client_kwargs = dict(settings.client_kwargs)
    if settings.endpoint_url:
        client_kwargs["endpoint_url"] = settings.endpoint_url
    region = settings.region or ("us-east-1" if settings.endpoint_url else None)
    if region:
        client_kwargs["region_name"] = region
    config_kwargs: dict[str, Any] = {
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": retry.timeout_s,
        "read_timeout": retry.timeout_s,
        "max_pool_connections": pool,
    }
    if settings.virtual_hosted:
        config_kwargs["s3"] = {"addressing_style": "virtual"}
    # SigV4 also for presigned GETs (the direct body path): botocore would presign with
    # the legacy SigV2 query scheme for some endpoints, which newer regions refuse
    config_kwargs["signature_version"] = "s3v4"
    config_kwargs.update(settings.config_kwargs)
    kwargs: dict[str, Any] = dict(settings.extra)
    # Objects are written through the raw client too, which s3fs's listing cache would
    # not see: list from the server every time.
    kwargs.setdefault("use_listings_cache", False)
    fs = s3fs.S3FileSystem(
        key=settings.key,
        secret=settings.secret,
        token=settings.token,
        anon=settings.anon,
        client_kwargs=client_kwargs,
        config_kwargs=config_kwargs,
        skip_instance_cache=True,
        **kwargs,
    )
    fs.retries = 1  # s3fs's own retry loop: one attempt (used by open_write and find)
    return fs


def _parse_total(content_range: str | None) -> int | None:
    # "bytes 0-99/1234" -> 1234
    if not content_range or "/" not in content_range:
        return None
    tail = content_range.rsplit("/", 1)[1].strip()
    return int(tail) if tail.isdigit() else None


async def _read_up_to(body: Any, n: int) -> tuple[list[bytes], BaseException | None]:
    """Up to ``n`` bytes of ``body``, and the error that stopped the read early (if any):
    bytes received before a failure are returned, so a resume starts after them."""
    chunks: list[bytes] = []
    got = 0
    error: BaseException | None = None
    try:
        while got < n:
            data = await body.read(n - got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
    except Exception as exc:
        error = exc
    return chunks, error


async def _pump(
    body: Any, n: int, fd: int, offset: int, digest: Any = None
) -> tuple[int, BaseException | None]:
    """Read up to ``n`` bytes of ``body`` and ``pwrite`` them at ``offset`` of ``fd``, all
    on the event loop; return the count written and the error that stopped it early.

    ``fd`` is the coroutine's own duplicate (see :meth:`_S3Stream.pump`): whatever
    happens to the caller's descriptor, these writes can only reach the same file."""
    got = 0
    error: BaseException | None = None
    try:
        while got < n:
            data = await body.read(min(n - got, _PUMP_PIECE))
            if not data:
                break
            write_all(fd, memoryview(data), offset + got)  # in small writes: see there
            if digest is not None:  # only what was written: a retry resumes after it
                digest.update(data)
            got += len(data)
    except Exception as exc:
        error = exc
    return got, error


#: Bytes asked of the body per read. aiohttp returns what it has buffered (at most this),
#: so this bounds the bytes a part holds in memory besides aiohttp's own read buffer:
#: at the default 16 parts in flight, 16 x 256 KiB (see docs/concepts.md, "Memory").
_PUMP_PIECE = 256 << 10
#: How long an interrupted call waits for its coroutine to end after cancelling it.
_CANCEL_WAIT_S = 30.0


def _run_on_loop(
    loop: Any, make: Callable[[], Coroutine[Any, Any, T]], cleanup: Callable[[], None] | None = None
) -> T:
    """Run the coroutine ``make()`` on ``loop`` (another thread's) and return its result.

    Unlike fsspec's ``sync``, an interrupt of the waiting thread (KeyboardInterrupt, a
    SIGTERM handler that raises, SystemExit) does not leave the coroutine running:
    it is cancelled and awaited (bounded by ``_CANCEL_WAIT_S``, further interrupts
    deferred) before the interrupt propagates. ``cleanup()`` runs on the loop once the
    coroutine has ended, however it ended (also if it never started)."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def finished(_task: Any) -> None:
        try:
            if cleanup is not None:
                cleanup()
        finally:
            done.set()

    def start() -> None:
        if box.get("cancelled"):
            finished(None)
            return
        task = loop.create_task(make())
        box["task"] = task
        task.add_done_callback(finished)

    def cancel() -> None:
        box["cancelled"] = True
        task = box.get("task")
        if task is not None:
            task.cancel()

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:  # the loop is closed
        if cleanup is not None:
            cleanup()
        raise
    try:
        while not done.wait(1.0):  # a timed wait, so that the thread stays interruptible
            pass
    except BaseException:
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(cancel)
        _wait_through_interrupts(done, _CANCEL_WAIT_S)
        raise
    task = box["task"]
    return cast(T, task.result())


def _wait_through_interrupts(event: threading.Event, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``event``; interrupts meanwhile are re-raised after."""
    deadline = time.monotonic() + timeout_s
    pending: BaseException | None = None
    while not event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            event.wait(min(left, 0.5))
        except BaseException as exc:  # a second Ctrl-C: finish cleaning up first
            pending = pending or exc
    if pending is not None:
        raise pending


class _S3Stream:
    def __init__(self, loop: Any, body: Any, total: int | None, length: int | None) -> None:
        self._loop = loop
        self._body = body
        self.total = total
        self._left = length
        self._error: BaseException | None = None

    def read_pieces(self, n: int) -> list[bytes]:
        if self._error is not None:
            raise self._error
        # One hop to the event loop per n bytes: aiohttp's read(n) returns whatever is
        # buffered (often a few KB), and each hop costs two thread switches.
        body = self._body
        pieces, error = _run_on_loop(self._loop, lambda: _read_up_to(body, n))
        if error is not None:
            if not pieces:
                raise error
            self._error = error  # deliver the bytes first, fail on the next read
        if self._left is not None:
            self._left -= sum(map(len, pieces))
            if not pieces and self._left > 0:
                raise TruncatedBodyError(f"response body ended {self._left} byte(s) early")
        return pieces

    def pump(self, fd: int, offset: int, n: int, digest: Any = None) -> int:
        """Write up to ``n`` bytes of the body at ``offset`` of ``fd`` in one hop to the
        event loop (reads and writes happen there: no thread switch per piece), feeding
        ``digest.update`` the same bytes in order; 0 at the end. Bytes written before a
        failure count; the failure is raised next.

        The coroutine writes through its own duplicate of ``fd``, closed when it ends,
        and an interrupted caller cancels and awaits it: no write of this call lands
        after it returns, nor in a file that later reuses the number ``fd``."""
        if self._error is not None:
            raise self._error
        own = os.dup(fd)
        body = self._body
        got, error = _run_on_loop(
            self._loop, lambda: _pump(body, n, own, offset, digest), cleanup=lambda: os.close(own)
        )
        if error is not None:
            if not got:
                raise error
            self._error = error
        if self._left is not None:
            self._left -= got
            if not got and self._left > 0:
                raise TruncatedBodyError(f"response body ended {self._left} byte(s) early")
        return int(got)

    def close(self) -> None:
        self._body.close()


#: S3 backends of this process, so that a forked child can disown the parent's.
_LIVE_S3: weakref.WeakSet[S3Backend] = weakref.WeakSet()
_INHERITED_S3: list[S3Backend] = []


def _disown_inherited_sessions() -> None:
    """In a forked child: the parent's s3fs sessions belong to the parent's event loop.
    Their finalizers would try to close them on the child's loop at exit and print
    "attached to a different loop" tracebacks: detach them (the child never uses
    them; its store makes its own backend)."""
    backends = list(_LIVE_S3)
    inherited = {id(b.fs) for b in backends}
    registry = getattr(weakref.finalize, "_registry", {})
    for fin in list(registry):
        info = fin.peek()
        if info is not None and id(info[0]) in inherited:
            fin.detach()
    # kept referenced for the child's life: collecting them would make aiohttp warn
    # about sessions that are the parent's to close
    _INHERITED_S3.extend(backends)
    _SHARED_S3.clear()  # the child makes its own clients
    _LIVE_S3.clear()


os.register_at_fork(after_in_child=_disown_inherited_sessions)

#: This process's S3 clients by what makes them differ (LRU, at most _SHARED_MAX).
_SHARED_S3: OrderedDict[str, S3Backend] = OrderedDict()
_SHARED_LOCK = threading.Lock()
_SHARED_MAX = 16


def shared_s3_backend(settings: S3Settings, retry: RetryConfig, pool: int) -> S3Backend:
    """This process's :class:`S3Backend` for ``settings``: one client per endpoint,
    credentials, region, options, retry config and pool size, shared by every store of
    the process whatever its bucket or prefix.

    Making a client loads botocore's service model and costs about 0.1 s (measured
    0.11–0.46 s here): a dataset made per epoch, a second dataset on the same store,
    or the index sidecars read by another store would each pay it before their first
    byte. Clients are safe to share between threads (each call runs on fsspec's
    event loop); after ``fork`` a child makes its own."""
    # every field but the bucket and prefix, as given (no deep copy of the options)
    fields = [
        (f.name, getattr(settings, f.name))
        for f in dataclasses.fields(settings)
        if f.name not in ("bucket", "prefix")
    ]
    key = hashlib.sha256(repr((fields, retry, pool)).encode()).hexdigest()
    with _SHARED_LOCK:
        backend = _SHARED_S3.get(key)
        if backend is None:
            backend = S3Backend(settings, retry, pool)
            _SHARED_S3[key] = backend
            while len(_SHARED_S3) > _SHARED_MAX:
                _SHARED_S3.popitem(last=False)
        else:
            _SHARED_S3.move_to_end(key)
        return backend


class S3Backend:
    """S3 (and COS) through the aiobotocore client that s3fs sets up, run on fsspec's
    event-loop thread; each call blocks the calling thread only."""

    def __init__(self, settings: S3Settings, retry: RetryConfig, pool: int) -> None:
        from fsspec.asyn import sync

        self.fs = make_s3_filesystem(settings, retry, pool)
        self._loop = self.fs.loop
        self._client = sync(self._loop, self.fs.set_session)
        #: bodies of GETs asked for ``direct`` (None: always through the client, as
        #: where a proxy is configured); see :mod:`fastload.storage.direct`
        self.direct: DirectGet | None = None
        if not proxy_configured(settings.config_kwargs):
            self.direct = DirectGet(retry.timeout_s, ca_bundle(settings.client_kwargs))
        #: GETs the client was asked again after the direct path passed them on
        self.direct_fallbacks = 0
        self._sent = threading.local()
        _LIVE_S3.add(self)

    def _call(self, method: str, **kwargs: Any) -> Any:
        fn = getattr(self._client, method)
        return _run_on_loop(self._loop, lambda: fn(**kwargs))

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    def requests_sent(self) -> int:
        """Requests the last :meth:`open_stream` of this thread sent (2 when the direct
        GET was answered and then asked again through the client)."""
        return int(getattr(self._sent, "n", 1))

    def size(self, path: str) -> int:
        bucket, key = self._split(path)
        return int(self._call("head_object", Bucket=bucket, Key=key)["ContentLength"])

    def open_stream(
        self, path: str, start: int, end: int | None, direct: bool = False
    ) -> ByteStream:
        """A body of ``path``'s bytes ``[start, end)``. ``direct``: its bytes over a
        plain HTTP connection (a GET the client presigns), unless that answer is one
        for the client (then asked again through it)."""
        bucket, key = self._split(path)
        self._sent.n = 1
        if direct and self.direct is not None:
            url = self._call(
                "generate_presigned_url",
                ClientMethod="get_object",
                Params={"Bucket": bucket, "Key": key},
                ExpiresIn=_PRESIGN_S,
            )
            try:
                return self.direct.open(url, start, end)
            except UseClient as exc:
                self.direct_fallbacks += 1
                if exc.sent:
                    self._sent.n = 2  # the direct GET, then the client's
                if exc.always:
                    self.direct = None  # e.g. TLS set up in ways only the client knows
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        resp = self._call("get_object", **kwargs)
        length = resp.get("ContentLength")
        total = _parse_total(resp.get("ContentRange"))
        if total is None and "Range" not in kwargs:
            total = length
        return _S3Stream(self._loop, resp["Body"], total, length)

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> None:
        bucket, key = self._split(path)
        self._call("put_object", Bucket=bucket, Key=key, Body=bytes(data))

    def open_write(self, path: str) -> IO[bytes]:
        return self.fs.open(path, "wb")

    def find(self, path: str) -> list[str]:
        return list(self.fs.find(path))

    def delete(self, path: str) -> None:
        bucket, key = self._split(path)
        self._call("delete_object", Bucket=bucket, Key=key)


#: Lifetime of a presigned GET (it is used at once; a resumed read signs again).
_PRESIGN_S = 3600


class _FileStream:
    def __init__(self, f: IO[bytes], total: int | None, start: int, end: int | None) -> None:
        self._f = f
        self.total = total
        f.seek(start)

    def read_pieces(self, n: int) -> list[bytes]:
        data = self._f.read(n)
        return [data] if data else []

    def close(self) -> None:
        self._f.close()


class FsspecBackend:
    """Any fsspec filesystem (``file://``, ``memory://``, ``gs://``, …)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._local = "file" in _protocols(fs)

    def size(self, path: str) -> int:
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{path} is a directory, not an object")
        return int(info["size"])

    def open_stream(
        self, path: str, start: int, end: int | None, direct: bool = False
    ) -> ByteStream:
        total = self.size(path)
        f = self.fs.open(path, "rb", block_size=0) if self._local else self.fs.open(path, "rb")
        return _FileStream(f, total, start, end)

    def _parent(self, path: str) -> None:
        parent = self.fs._parent(path)
        if parent and self._local:
            self.fs.makedirs(parent, exist_ok=True)

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> None:
        self._parent(path)
        if self._local:
            # Publish atomically: a reader never sees a half-written object.
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, bytes(data))

    def open_write(self, path: str) -> IO[bytes]:
        self._parent(path)
        return self.fs.open(path, "wb")

    def find(self, path: str) -> list[str]:
        return list(self.fs.find(path))

    def delete(self, path: str) -> None:
        self.fs.rm_file(path)


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
