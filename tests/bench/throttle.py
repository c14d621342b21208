"""A bandwidth-limited TCP proxy: forwards bytes both ways, server → client at most
``bytes_per_s`` over all connections together (a token bucket), so a store behind it
looks like a slow network link. Counts connections and bytes forwarded."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from support.sockets import accepted, close_all

__all__ = ["ThrottleProxy"]

_BUF = 16 * 1024


class _Bucket:
    """A token bucket shared by every connection (burst: a tenth of a second)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(_BUF, rate / 10)
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                need = (n - self.tokens) / self.rate
            time.sleep(min(need, 0.05))


class ThrottleProxy:
    """Listen on 127.0.0.1 (a free port) and forward to ``upstream``; use as a context
    manager. ``endpoint_url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, upstream: tuple[str, int], bytes_per_s: float) -> None:
        self.upstream = upstream
        self.bucket = _Bucket(bytes_per_s)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []

    def __enter__(self) -> ThrottleProxy:
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        t = threading.Thread(target=self._accept, name="throttle-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            socks = list(self._socks)
        close_all(socks)
        for t in self._threads:
            t.join(timeout=5)
        self.listener.close()

    def _accept(self) -> None:
        for client in accepted(self.listener, self._stop):
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                self._socks += [client, server]
            for src, dst, limited in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pump, args=(src, dst, limited), daemon=True)
                t.start()
                with self._lock:
                    self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, limited: bool) -> None:
        try:
            while not self._stop.is_set():
                data = src.recv(_BUF)
                if not data:
                    break
                if limited:
                    self.bucket.take(len(data))
                    with self._lock:
                        self.bytes_down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
