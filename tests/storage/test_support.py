"""The test machinery itself: the fault proxy's HTTP handling and the thread-leak guard."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.faultproxy import FaultProxy
from support.leaks import leaked_threads

pytestmark = pytest.mark.usefixtures("no_thread_leaks")


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            out = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(b"G" * 100_000)

    def do_HEAD(self) -> None:
        self._reply(b"G" * 100_000)

    def do_PUT(self) -> None:
        self._reply(b"got " + str(len(self._body())).encode())


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, name="echo-server")
    thread.start()
    p = FaultProxy(("127.0.0.1", server.server_address[1]), stall_s=0.5).start()
    try:
        yield p
    finally:
        p.stop()
        server.shutdown()
        server.server_close()
        thread.join()


def connect(p: FaultProxy) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)


def test_keep_alive_chunked_and_head(proxy: FaultProxy) -> None:
    conn = connect(proxy)
    conn.request("PUT", "/a", body=iter([b"x" * 1000, b"y" * 234]), encode_chunked=True)
    assert conn.getresponse().read() == b"got 1234"
    conn.request("HEAD", "/b")
    resp = conn.getresponse()
    assert resp.getheader("Content-Length") == "100000"
    assert resp.read() == b""
    conn.request("GET", "/c")
    assert conn.getresponse().read() == b"G" * 100_000
    conn.close()
    assert proxy.stats.connections == 1
    assert proxy.stats.requests == 3
    assert proxy.stats.body_bytes_to_client == 8 + 100_000
    assert [r.method for r in proxy.log] == ["PUT", "HEAD", "GET"]


def test_slowdown_is_an_s3_error_and_keeps_the_connection(proxy: FaultProxy) -> None:
    proxy.set_faults(schedule={1: "slowdown"})
    conn = connect(proxy)
    conn.request("GET", "/bucket/key")
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 503
    assert b"<Code>SlowDown</Code>" in body
    assert b"<Resource>/bucket/key</Resource>" in body
    conn.request("GET", "/bucket/key")
    assert conn.getresponse().read() == b"G" * 100_000
    assert proxy.stats.connections == 1
    assert proxy.stats.forwarded == 1


def test_reset_truncate_and_stall(proxy: FaultProxy) -> None:
    proxy.set_faults(schedule={1: "reset", 2: "truncate", 3: "stall"})
    conn = connect(proxy)
    conn.request("GET", "/r")
    with pytest.raises(ConnectionResetError):
        conn.getresponse()
    conn = connect(proxy)
    conn.request("GET", "/t")
    with pytest.raises(http.client.IncompleteRead):
        conn.getresponse().read()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.2)
    conn.request("GET", "/s")
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()
    assert proxy.stats.faults == {"reset": 1, "stall": 1, "slowdown": 0, "truncate": 1}
    truncated = proxy.log[1]
    assert 0 < truncated.body_bytes < 100_000


def test_seeded_probabilities_repeat(proxy: FaultProxy) -> None:
    def run() -> list[str | None]:
        proxy.set_faults(slowdown=0.3, seed=42)
        start = len(proxy.log)
        conn = connect(proxy)
        for _ in range(30):
            conn.request("GET", "/x")
            conn.getresponse().read()
        conn.close()
        return [r.fault for r in proxy.log[start:]]

    first = run()
    assert first == run()
    assert 0 < first.count("slowdown") < 30


def test_leaked_threads_sees_a_live_thread() -> None:
    before = set(threading.enumerate())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="deliberate-leak")
    t.start()
    assert leaked_threads(before, grace_s=0.1) == ["deliberate-leak"]
    stop.set()
    t.join()
    assert leaked_threads(before, grace_s=0.1) == []
