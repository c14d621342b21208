"""Plain HTTP(S) stores (fsspec's HTTP filesystem): a server that cannot be reached is
retried and reported as such, never as a missing object."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.config import FetchConfig, RetryConfig
from fastload.errors import FetchError
from fastload.storage import ObjectNotFoundError, open_store

RETRY = RetryConfig(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static HTTP server on 127.0.0.1 serving ``tmp_path/www``."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_unreachable_server_is_retried_and_named(http_root: tuple[str, Path]) -> None:
    url = f"http://127.0.0.1:{_free_port()}/data"
    store = open_store(url, fetch=FetchConfig(retry=RETRY))
    with pytest.raises(FetchError) as info:
        store.read("obj")
    assert info.value.attempts == RETRY.max_attempts
    assert f"{url}/obj" in str(info.value)
    assert "Cannot connect" in str(info.value)  # the cause, not "FileNotFoundError: url"
    assert not isinstance(info.value, FileNotFoundError)


def test_a_missing_file_is_a_missing_object_and_a_present_one_reads(
    http_root: tuple[str, Path],
) -> None:
    base, root = http_root
    (root / "obj").write_bytes(b"served bytes")
    store = open_store(base, fetch=FetchConfig(retry=RETRY))
    assert store.read("obj") == b"served bytes"
    with pytest.raises(ObjectNotFoundError, match="no-such-file"):
        store.read("no-such-file")
    assert store.stats().retries == 0
