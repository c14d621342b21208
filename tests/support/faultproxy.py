"""A real TCP proxy in front of an HTTP/1.1 server (SeaweedFS's S3 port) that injects faults.

Per request it may, on a schedule or with a seeded probability:

- ``reset``: abort the client connection with a TCP RST (``SO_LINGER`` 0, then close);
- ``stall``: hold the connection without sending a byte for ``stall_s`` seconds;
- ``slowdown``: answer ``503 SlowDown`` with a proper S3 XML error body (keep-alive);
- ``truncate``: forward the response headers and part of the body, then close.

Independently, ``body_rate`` (bytes per second, None: unlimited) slows every response
body down, per connection (a slow link: a download stays in flight for a while).

It parses HTTP/1.1 just enough for that (request line, headers, Content-Length or
chunked request bodies; responses with Content-Length or chunked), so keep-alive
connections work. It counts connections, requests, faults and bytes forwarded
upstream → client, and keeps a log of every request (:class:`RequestRecord`).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from support.sockets import accepted, close_all

__all__ = ["FAULTS", "FaultProxy", "ProxyStats", "RequestRecord"]

FAULTS = ("reset", "stall", "slowdown", "truncate")
_BUF = 64 * 1024


@dataclass
class RequestRecord:
    """One request seen by the proxy: what was asked, what was done, what was sent back."""

    number: int
    method: str
    target: str
    range: str | None
    fault: str | None
    status: int | None = None
    body_bytes: int = 0


@dataclass
class ProxyStats:
    """Counters: ``bytes_to_client`` counts every byte forwarded upstream → client
    (headers included); ``body_bytes_to_client`` only response bodies."""

    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    bytes_to_client: int = 0
    body_bytes_to_client: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))


class _Closed(Exception):
    """The peer closed the connection."""


class _Reader:
    """Buffered reads from a socket: lines, exact counts, header blocks."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(_BUF)
        if not data:
            raise _Closed
        self.buf += data

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > 1 << 20:
                raise _Closed
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head + b"\r\n\r\n"

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line + b"\r\n"

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def some(self, n: int) -> bytes:
        if not self.buf:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return lines[0], headers


def _read_chunked(reader: _Reader) -> bytes:
    out = b""
    while True:
        size_line = reader.line()
        out += size_line
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers up to the empty line
                line = reader.line()
                out += line
                if line == b"\r\n":
                    return out
        out += reader.exact(size + 2)


def _slowdown_response(target: str, request_id: int) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{target.split('?')[0]}</Resource>"
        f"<RequestId>faultproxy-{request_id}</RequestId></Error>"
    ).encode()
    head = (
        "HTTP/1.1 503 Slow Down\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()
    return head + body


def _rst_close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """A fault-injecting TCP proxy on ``127.0.0.1:<free port>`` → ``upstream``.

    ``endpoint_url`` is where clients connect. :meth:`set_faults` sets probabilities
    (per request) and a schedule; :attr:`stats` and :attr:`log` record what happened.
    Use as a context manager or :meth:`start`/:meth:`stop`; stopping joins every thread.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        stall_s: float = 10.0,
        truncate_linger_s: float = 0.2,
        base_options: dict[str, object] | None = None,
    ) -> None:
        self.upstream = upstream
        self._base_options = dict(base_options or {})
        self.stall_s = stall_s
        # Pause between the partial body and the close, so the client has read every
        # forwarded byte before it sees the connection drop (makes resume testable).
        self.truncate_linger_s = truncate_linger_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.stats = ProxyStats()
        self.log: list[RequestRecord] = []
        #: bytes per second each response body is forwarded at (None: as fast as it comes)
        self.body_rate: float | None = None
        self._accept_thread: threading.Thread | None = None
        self.set_faults()

    # -- configuration ---------------------------------------------------------------

    def set_faults(
        self,
        reset: float = 0.0,
        stall: float = 0.0,
        slowdown: float = 0.0,
        truncate: float = 0.0,
        seed: int = 0,
        schedule: dict[int, str] | None = None,
        methods: tuple[str, ...] | None = None,
        match: Callable[[str, str, dict[str, str]], bool] | None = None,
        truncate_fraction: tuple[float, float] = (0.2, 0.8),
        down: bool = False,
    ) -> None:
        """Set the faults from now on.

        Each request draws one fault with the given probabilities (seeded ``seed``);
        ``schedule`` maps 1-based request numbers (counted from this call) to a fault
        and wins over the draw. ``methods`` / ``match(method, target, headers)`` limit
        which requests may be faulted. ``truncate_fraction`` bounds the share of the
        body forwarded before a truncation. ``down=True`` resets every connection.
        """
        for name in schedule.values() if schedule else ():
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; expected one of {FAULTS}")
        with self._lock:
            self._p = {"reset": reset, "stall": stall, "slowdown": slowdown, "truncate": truncate}
            self._rng = random.Random(seed)
            self._schedule = dict(schedule or {})
            self._methods = methods
            self._match = match
            self._fraction = truncate_fraction
            self._down = down
            self._base = self.stats.requests

    @property
    def storage_options(self) -> dict[str, object]:
        """``base_options`` (the server's credentials) with the endpoint set to the proxy."""
        return {**self._base_options, "endpoint_url": self.endpoint_url}

    def _choose(self, method: str, target: str, headers: dict[str, str]) -> tuple[int, str | None]:
        with self._lock:
            self.stats.requests += 1
            number = self.stats.requests
            relative = number - self._base
            if self._methods is not None and method not in self._methods:
                return number, None
            if self._match is not None and not self._match(method, target, headers):
                return number, None
            fault = self._schedule.get(relative)
            draw = self._rng.random()
            if fault is None:
                acc = 0.0
                for name in FAULTS:
                    acc += self._p[name]
                    if draw < acc:
                        fault = name
                        break
            if fault is not None:
                self.stats.faults[fault] += 1
            return number, fault

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start accepting connections."""
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"faultproxy-accept-{self.port}", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Close every connection and join every thread (raises if one will not stop)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        close_all(socks)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=10)
        threads = [t for t in [self._accept_thread, *self._threads] if t is not None]
        for t in threads:
            t.join(timeout=10)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"fault proxy threads did not stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        for client in accepted(self._listener, self._stop):
            client.settimeout(None)
            with self._lock:
                self.stats.connections += 1
                self._socks.add(client)
                self._threads = [t for t in self._threads if t.is_alive()]
                t = threading.Thread(
                    target=self._serve, args=(client,), name=f"faultproxy-conn-{self.port}"
                )
                self._threads.append(t)
            t.start()

    # -- one client connection -------------------------------------------------------

    def _track(self, sock: socket.socket | None, add: bool) -> None:
        if sock is None:
            return
        with self._lock:
            if add:
                self._socks.add(sock)
            else:
                self._socks.discard(sock)

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        up_reader: _Reader | None = None
        reader = _Reader(client)
        try:
            while not self._stop.is_set():
                head = reader.head()
                request_line, headers = _parse_head(head)
                method, target = [*request_line.split(" "), "", ""][:2]
                if headers.get("expect", "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = (
                        b"".join(
                            line + b"\r\n"
                            for line in head[:-4].split(b"\r\n")
                            if not line.lower().startswith(b"expect:")
                        )
                        + b"\r\n"
                    )
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    body = _read_chunked(reader)
                else:
                    body = reader.exact(int(headers.get("content-length", "0") or 0))
                number, fault = self._choose(method, target, headers)
                if self._down:
                    fault = "reset"
                record = RequestRecord(number, method, target, headers.get("range"), fault)
                with self._lock:
                    self.log.append(record)
                if fault == "reset":
                    _rst_close(client)
                    return
                if fault == "stall":
                    self._stop.wait(self.stall_s)
                    return
                if fault == "slowdown":
                    client.sendall(_slowdown_response(target, number))
                    record.status = 503
                    continue
                for fresh in (False, True):
                    if upstream is None or fresh:
                        self._track(upstream, False)
                        if upstream is not None:
                            upstream.close()
                        upstream = socket.create_connection(self.upstream, timeout=60)
                        self._track(upstream, True)
                        up_reader = _Reader(upstream)
                    assert up_reader is not None
                    try:
                        upstream.sendall(head + body)
                        keep = self._relay_response(method, client, up_reader, record, fault)
                        break
                    except _Closed:
                        # The server dropped an idle keep-alive connection before
                        # answering: retry once on a fresh one, as a client would.
                        if fresh or record.status is not None:
                            raise
                with self._lock:
                    self.stats.forwarded += 1
                if not keep:
                    return
        except (_Closed, OSError):
            return
        finally:
            self._track(upstream, False)
            self._track(client, False)
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.close()
            with contextlib.suppress(OSError):
                client.close()

    def _send(self, client: socket.socket, data: bytes, record: RequestRecord, body: bool) -> None:
        # counted before they are sent: a client that has read them sees them counted
        with self._lock:
            self.stats.bytes_to_client += len(data)
            if body:
                self.stats.body_bytes_to_client += len(data)
                record.body_bytes += len(data)
        rate = self.body_rate
        if body and rate:
            step = max(int(rate / 20), 1)  # 20 sends a second
            for i in range(0, len(data), step):
                client.sendall(data[i : i + step])
                if self._stop.wait(len(data[i : i + step]) / rate):
                    return
            return
        client.sendall(data)

    def _relay_response(
        self,
        method: str,
        client: socket.socket,
        up: _Reader,
        record: RequestRecord,
        fault: str | None,
    ) -> bool:
        """Forward one response; returns whether the connection may be kept alive."""
        while True:
            head = up.head()
            status_line, headers = _parse_head(head)
            status = int(status_line.split(" ")[1])
            if status != 100:
                break
        record.status = status
        keep = headers.get("connection", "").lower() != "close"
        no_body = method == "HEAD" or status in (204, 304)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = 0 if no_body else int(headers.get("content-length", "0") or 0)
        if fault == "truncate":
            self._send(client, head, record, body=False)
            if no_body or chunked or length == 0:
                return False
            lo, hi = self._fraction
            with self._lock:
                share = self._rng.uniform(lo, hi)
            cut = max(1, min(length - 1, int(length * share)))
            sent = 0
            while sent < cut:
                data = up.some(min(_BUF, cut - sent))
                self._send(client, data, record, body=True)
                sent += len(data)
            self._stop.wait(self.truncate_linger_s)
            return False
        self._send(client, head, record, body=False)
        if no_body:
            return keep
        if chunked:
            self._send(client, _read_chunked(up), record, body=True)
            return keep
        if "content-length" not in headers:
            # Body delimited by close: relay until the server closes.
            while True:
                try:
                    data = up.some(_BUF)
                except _Closed:
                    return False
                self._send(client, data, record, body=True)
        left = length
        while left > 0:
            data = up.some(min(_BUF, left))
            self._send(client, data, record, body=True)
            left -= len(data)
        return keep
