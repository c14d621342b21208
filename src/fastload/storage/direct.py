"""Object bodies over plain blocking HTTP/1.1: ``recv_into`` one buffer, hashed and
``pwrite``-n as it arrives, in the calling thread.

Why not aiohttp for the bytes: through aiobotocore, every socket read of a body is a
callback on the event loop (protocol, stream reader, read-timeout reschedule, future)
plus a thread hop per pump. Measured on this project's 2-core machines, ten 32 MB
objects from SeaweedFS into files: 0.27 CPU s per 316 MB through the aiohttp pump,
against 0.17 CPU s here, *with* the xxh3 of every byte included (which the cache
otherwise re-reads the file for: 0.055 s more). On a machine where the store and the
trainer share the cores, CPU is what a cold epoch waits on.

What stays with the client: the request is a presigned GET that the aiobotocore
client signs (:meth:`S3Backend.open_stream`), so the endpoint, addressing style,
region, credentials and session token are exactly the client's. Only answers 200 and
206 are read here, 5xx/429 raised as retryable and 404 as missing; any other
answer (403, a redirect, a 400 such as an expired token) raises :class:`UseClient`,
and the caller asks again through the client, whose error or redirect handling the
user gets exactly as before.

Not used (the client reads the body) where the client is configured for a proxy or a
proxy variable is set, and with ``FetchConfig(direct_reads=False)``.

Standard library only: the core imports without s3fs.
"""

from __future__ import annotations

import http.client
import mmap
import os
import re
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from fastload.config import env
from fastload.storage.retry import TruncatedBodyError

__all__ = [
    "ConnectFailed",
    "DirectGet",
    "DirectStream",
    "HttpError",
    "UseClient",
    "ca_bundle",
    "proxy_configured",
    "write_all",
    "write_piece",
]

#: Bytes per ``recv_into``: large enough that per-read Python work is noise, small
#: enough that the buffer is still in the CPU cache when it is hashed and written
#: (1 MiB measured best here; 4 MiB cost 1.5x the CPU).
BUFFER = 1 << 20
#: Bytes per ``pwrite`` into a part file at most (see :func:`write_piece`).
WRITE_PIECE = BUFFER
_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
_write_piece: int | None = None
#: Folio order of a write where the kernel reports free pages (see :func:`write_piece`).
_SMALL_ORDER = 3
#: Bytes one :meth:`DirectStream.pump` call moves at most, so the caller's cancel
#: check runs between slices.
SLICE = 8 << 20
#: Idle keep-alive connections kept per endpoint.
IDLE_MAX = 32
#: Bytes of an error body read to find its S3 error code.
_ERROR_BODY_MAX = 64 << 10
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")
#: How a connection the server has closed shows on the next request over it (a TLS
#: one as an EOF or close_notify; its setup, where TLS can fail otherwise, is in
#: :meth:`DirectGet._connect`).
_DROPPED = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


class UseClient(Exception):
    """This answer is for the client to handle (an error code, a redirect): ask again
    through it. ``always``: so is every later one (a TLS setup the client has and this
    path does not, e.g. a client certificate or an unusual CA store)."""

    def __init__(self, why: str, always: bool = False, sent: bool = False) -> None:
        super().__init__(why)
        self.always = always
        #: whether the GET was sent (and answered) before it was handed on
        self.sent = sent


class ConnectFailed(ConnectionError):
    """The endpoint could not be reached (refused, unresolvable, timed out); names it.
    Retried like any connection failure."""


class HttpError(Exception):
    """A retryable HTTP answer (5xx, 429) or a missing object (404), shaped like
    botocore's ``ClientError`` (``response["Error"]["Code"]``,
    ``response["ResponseMetadata"]["HTTPStatusCode"]``) so that
    :func:`fastload.storage.retry.classify` sorts it the same way."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}".strip())
        self.response = {
            "Error": {"Code": code or str(status), "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }


def proxy_configured(config_kwargs: Mapping[str, Any]) -> bool:
    """Whether requests would go through a proxy (the client's ``proxies`` option or a
    proxy environment variable, either case)."""
    if config_kwargs.get("proxies"):
        return True
    return any(env(v) or env(v.upper()) for v in _PROXY_VARS)


def ca_bundle(client_kwargs: Mapping[str, Any]) -> Any:
    """What the client verifies TLS with: its ``verify`` option (False, or a CA bundle
    path), else ``$AWS_CA_BUNDLE`` as botocore reads it, else None (the system's)."""
    if "verify" in client_kwargs:
        return client_kwargs["verify"]
    return env("AWS_CA_BUNDLE") or None


def _ssl_context(verify: Any) -> ssl.SSLContext:
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if isinstance(verify, (str, os.PathLike)):
        return ssl.create_default_context(cafile=os.fspath(verify))
    return ssl.create_default_context()


class DirectGet:
    """Keep-alive connections per endpoint and :meth:`open` of presigned GETs.
    Thread-safe; a forked child drops the parent's connections (never reads from
    them) and opens its own."""

    def __init__(self, timeout_s: float, verify: Any = None) -> None:
        self.timeout_s = timeout_s
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[tuple[str, str], list[http.client.HTTPConnection]] = {}
        #: requests sent, and connections opened (a reused one is not counted)
        self.requests = 0
        self.connections = 0

    def _take(
        self, scheme: str, netloc: str, fresh: bool = False
    ) -> tuple[http.client.HTTPConnection, bool]:
        if self._pid != os.getpid():
            # forked: the parent's sockets (dropping our references closes only our
            # copies) and a lock a parent's thread may have held at fork time
            self._lock, self._idle, self._pid = threading.Lock(), {}, os.getpid()
        with self._lock:
            idle = self._idle.get((scheme, netloc))
            if idle and not fresh:
                return idle.pop(), True
            self.connections += 1
        if scheme == "https":
            if self._ssl is None:
                self._ssl = _ssl_context(self._verify)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                netloc, timeout=self.timeout_s, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(netloc, timeout=self.timeout_s)
        return conn, False

    def _give_back(self, scheme: str, netloc: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._pid == os.getpid():
                idle = self._idle.setdefault((scheme, netloc), [])
                if len(idle) < IDLE_MAX:
                    idle.append(conn)
                    return
        conn.close()

    def open(self, url: str, start: int, end: int | None) -> DirectStream:
        """GET bytes ``[start, end)`` (to the end if None) of the presigned ``url``.

        Raises :class:`UseClient` for answers the client must handle, :class:`HttpError`
        for retryable ones, and connection errors as ``http.client``/``socket`` raise
        them (all classified as retryable)."""
        parts = urllib.parse.urlsplit(url)
        scheme, netloc = parts.scheme, parts.netloc
        if scheme not in ("http", "https"):
            raise UseClient(f"scheme {scheme!r}")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        ranged = start > 0 or end is not None
        fresh = False
        while True:
            conn, reused = self._take(scheme, netloc, fresh)
            if not reused:
                self._connect(conn, scheme, netloc)
            try:
                conn.putrequest("GET", target, skip_accept_encoding=True)
                if ranged:
                    last = "" if end is None else str(end - 1)
                    conn.putheader("Range", f"bytes={start}-{last}")
                conn.putheader("Accept-Encoding", "identity")
                conn.endheaders()
                with self._lock:
                    self.requests += 1
                resp = conn.getresponse()
            except _DROPPED:
                conn.close()
                if reused:
                    fresh = True  # the server had closed the idle connection: a new one
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            break
        try:
            return self._answer(resp, conn, scheme, netloc, start, ranged)
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _connect(conn: http.client.HTTPConnection, scheme: str, netloc: str) -> None:
        try:
            conn.connect()
        except ssl.SSLError as exc:
            conn.close()
            if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
                raise ConnectFailed(f"could not connect to {scheme}://{netloc}: {exc}") from exc
            raise UseClient(f"TLS: {exc}", always=True) from exc
        except OSError as exc:
            conn.close()
            raise ConnectFailed(f"could not connect to {scheme}://{netloc}: {exc}") from exc

    def _answer(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        scheme: str,
        netloc: str,
        start: int,
        ranged: bool,
    ) -> DirectStream:
        status = resp.status
        length = resp.getheader("Content-Length")
        size = int(length) if length is not None and length.isdigit() else None
        if status == 206 or (status == 200 and not (ranged and start > 0)):
            if status == 206:
                crange = resp.getheader("Content-Range") or ""
                tail = crange.rsplit("/", 1)[-1].strip() if "/" in crange else ""
                total = int(tail) if tail.isdigit() else None
            else:
                total = size
            return DirectStream(self, resp, conn, scheme, netloc, total, size)
        body = resp.read(_ERROR_BODY_MAX) if status >= 300 else b""
        conn.close()
        if status >= 500 or status == 429 or status == 404:
            text = body.decode("utf-8", "replace")
            code = _tag(text, "Code")
            raise HttpError(status, code, _tag(text, "Message") or resp.reason)
        # 200 to a range that starts later (the server ignored Range), 3xx, other 4xx
        # (403 may be credentials that expired since they signed: the client refreshes)
        raise UseClient(f"HTTP {status}", sent=True)


def _tag(xml: str, name: str) -> str:
    m = re.search(rf"<{name}>([^<]*)</{name}>", xml)
    return m.group(1).strip() if m else ""


def write_piece() -> int:
    """Bytes per ``pwrite`` of a downloaded body: 32 KiB (:data:`_SMALL_ORDER`'s
    folios, or half the smallest block the kernel hands back to the hypervisor where
    that is less) where the kernel has free page reporting; :data:`WRITE_PIECE`
    where it has none.

    The page cache sizes the folio it allocates by the write's length, and a guest
    with free page reporting (virtio-balloon) returns free blocks of
    ``page_reporting_order`` and up to the host: a large folio comes from such a
    block (or from one split for it), and every first touch of its pages then faults
    on the host. Measured on this project's 2-core KVM guests (order 5, 128 KiB
    blocks), a file written 4 s after the previous one was deleted
    (``benchmarks/bench_page_cache_writes.py``), CPU s/GB: 316 MB in 128 KiB-4 MiB
    writes 2.2-2.7, in 64 KiB 0.24, in 32 KiB 0.23-0.25; 800 MB in 1 MiB 2.16, in
    64 KiB 0.84-1.07, in 32 KiB 0.26-0.27, in 16 KiB 0.35, in 8 KiB 0.55 (the
    syscalls). Order-3 folios and below are what the per-CPU page lists keep.
    Smaller writes are not free where nothing is reported: 64 KiB writes cost ~0.03
    CPU s/GB more than 1 MiB ones, and reading the file back through a fresh mapping
    ~0.05 more (0.11 against 0.06), hence no split there."""
    global _write_piece
    if _write_piece is None:
        piece = WRITE_PIECE
        with suppress(OSError, ValueError):
            order = int(_REPORTING_ORDER.read_text())
            piece = mmap.PAGESIZE << max(0, min(_SMALL_ORDER, order - 1))
        _write_piece = piece
    return _write_piece


def write_all(fd: int, data: memoryview, pos: int) -> None:
    """``pwrite`` all of ``data`` at ``pos`` of ``fd``, :func:`write_piece` bytes per
    call (see there why)."""
    step = write_piece()
    end = len(data)
    done = 0
    while done < end:
        done += os.pwrite(fd, data[done : done + step], pos + done)


class DirectStream:
    """An open body (``ByteStream``): ``read_pieces`` for callers that want bytes,
    :meth:`pump` to write them into a file, hashed on the way."""

    def __init__(
        self,
        owner: DirectGet,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        scheme: str,
        netloc: str,
        total: int | None,
        length: int | None,
    ) -> None:
        self._owner = owner
        self._resp = resp
        self._conn: http.client.HTTPConnection | None = conn
        self._where = (scheme, netloc)
        self.total = total
        self._left = length
        self._error: BaseException | None = None
        self._buf: memoryview | None = None

    def read_pieces(self, n: int) -> list[bytes]:
        if self._error is not None:
            raise self._error
        data = self._resp.read(n)
        self._note(len(data))
        return [data] if data else []

    def pump(self, fd: int, offset: int, n: int, digest: Any = None) -> int:
        """Write up to ``n`` bytes of the body at ``offset`` of ``fd`` (at most
        :data:`SLICE` per call), feeding ``digest.update`` the same bytes in order;
        0 at the end. Bytes written before a failure count; the failure is raised on
        the next call."""
        if self._error is not None:
            raise self._error
        if self._buf is None:
            self._buf = memoryview(bytearray(BUFFER))
        buf, resp = self._buf, self._resp
        want = min(n, SLICE)
        got = 0
        while got < want:
            try:
                k = resp.readinto(buf[: min(BUFFER, want - got)])
            except (OSError, http.client.HTTPException) as exc:
                if not got:
                    raise
                self._error = exc  # deliver what arrived first, fail on the next call
                break
            if not k:
                break
            # the file's own failures (ENOSPC, EIO) propagate as they are
            write_all(fd, buf[:k], offset + got)
            if digest is not None:  # still in the CPU cache; only what was written
                digest.update(buf[:k])
            got += k
        self._note(got)
        return got

    def _note(self, got: int) -> None:
        if self._left is not None:
            self._left -= got
            if not got and self._left > 0:
                raise TruncatedBodyError(f"response body ended {self._left} byte(s) early")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._error is None and self._left == 0 and self._resp.isclosed():
            self._owner._give_back(*self._where, conn)  # the body was read whole: reuse
        else:
            conn.close()
