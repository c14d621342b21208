"""GET bodies over plain HTTP connections (storage/direct.py), against SeaweedFS through
the TCP fault proxy: what goes on the wire, the checksum taken as bytes arrive, a
resumed body, answers handed back to the client, and where the path is not used."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastload.cache import DiskTier, EntryKey
from fastload.config import FetchConfig, RetryConfig
from fastload.errors import CacheError, StorageError
from fastload.shards.checksum import Xxh3Hasher, xxh3_128
from fastload.shards.gzipped import shard_fetcher
from fastload.storage import AccessDeniedError, ObjectNotFoundError, ObjectStore, open_store
from fastload.storage.backends import S3Backend, shared_s3_backend
from fastload.storage.url import resolve_s3
from support.faultproxy import FaultProxy
from support.seaweed import SeaweedServer
from support.sockets import accepted

pytestmark = pytest.mark.usefixtures("no_thread_leaks")

RETRY = RetryConfig(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=30.0)


def _stores(
    seaweed: SeaweedServer, proxy: FaultProxy, **fetch: Any
) -> tuple[ObjectStore, ObjectStore]:
    url = seaweed.new_url()
    plain = open_store(url, seaweed.storage_options)
    plain.write_bytes("warm-up", b"")
    return plain, open_store(url, proxy.storage_options, fetch=FetchConfig(retry=RETRY, **fetch))


def test_bodies_come_over_presigned_gets_and_stay_byte_identical(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    plain, via = _stores(seaweed, fault_proxy)
    data = os.urandom(3_000_000)
    plain.write_bytes("obj", data)
    digest = Xxh3Hasher()
    out = io.BytesIO()
    assert via.download("obj", out, expected_size=len(data), digest=digest) == len(data)
    assert out.getvalue() == data
    assert (digest.nbytes, digest.hexdigest_tagged()) == (len(data), xxh3_128(data))
    assert via.read_range("obj", 1000, 1100) == data[1000:1100]
    gets = [r for r in fault_proxy.log if r.method == "GET"]
    assert len(gets) == 2
    # signed in the query (SigV4), not by the client's request
    assert all("X-Amz-Signature=" in r.target for r in gets), [r.target for r in gets]
    assert gets[1].range == "bytes=1000-1099"
    backend = via._get_backend()
    assert isinstance(backend, S3Backend)
    assert backend.direct is not None
    assert backend.direct.connections == 1  # the second GET reused the connection


def test_a_resumed_body_keeps_its_checksum_whole(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A body cut mid-way is resumed at its first missing byte; the checksum taken as
    the bytes arrive spans both responses, and the cache publishes the entry without
    reading it back."""
    plain, via = _stores(seaweed, fault_proxy)
    data = os.urandom(2_500_000)
    plain.write_bytes("shard.tar", data)
    fault_proxy.set_faults(schedule={1: "truncate"})
    tier = DiskTier(tmp_path / "cache")
    key = EntryKey("d" * 16, "shard.tar", xxh3_128(data))
    with tier.pinned(key, len(data), shard_fetcher(via, "shard.tar", len(data))) as path:
        assert path.read_bytes() == data
    gets = [r for r in fault_proxy.log if r.method == "GET"]
    assert [g.fault for g in gets] == ["truncate", None]
    assert gets[1].range is not None
    assert gets[1].range.startswith("bytes=")
    assert int(gets[1].range[6:].split("-")[0]) > 0  # resumed, not restarted
    st = tier.stats()
    assert (st.fetches, st.hashed_on_arrival) == (1, 1)
    tier.close()


def test_a_body_that_differs_from_the_manifest_is_refused(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """Hashing on arrival checks the same bytes the file holds: an object replaced by
    other bytes of the same size is never published."""
    plain, via = _stores(seaweed, fault_proxy)
    good = os.urandom(1_500_000)
    plain.write_bytes("shard.tar", bytes(reversed(good)))
    tier = DiskTier(tmp_path / "cache")
    key = EntryKey("d" * 16, "shard.tar", xxh3_128(good))
    with pytest.raises(CacheError, match="checksum"):
        tier.get(key, len(good), shard_fetcher(via, "shard.tar", len(good)))
    assert not tier.contains(key)
    assert tier.stats().failures == 1
    tier.close()


def test_parts_read_in_parallel_are_hashed_from_the_file(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    plain, via = _stores(
        seaweed, fault_proxy, part_size=256 * 1024, parallel_threshold=512 * 1024, concurrency=4
    )
    data = os.urandom(1_200_000)
    plain.write_bytes("shard.tar", data)
    tier = DiskTier(tmp_path / "cache")
    key = EntryKey("d" * 16, "shard.tar", xxh3_128(data))
    with tier.pinned(key, len(data), shard_fetcher(via, "shard.tar", len(data))) as path:
        assert path.read_bytes() == data
    assert len([r for r in fault_proxy.log if r.method == "GET"]) == 5
    st = tier.stats()
    assert (st.fetches, st.hashed_on_arrival) == (1, 0)  # out of order: read back instead
    tier.close()


def test_a_missing_object_is_one_request_and_a_clear_error(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    _, via = _stores(seaweed, fault_proxy)
    with pytest.raises(ObjectNotFoundError, match=r"no-such-key.*NoSuchKey"):
        via.read("no-such-key")
    assert len([r for r in fault_proxy.log if r.method == "GET"]) == 1
    assert via.stats().retries == 0


def test_a_refused_get_is_asked_again_through_the_client(
    seaweed: SeaweedServer, fault_proxy: FaultProxy
) -> None:
    """403 may be credentials that expired after they signed: the client asks again
    (and refreshes them where it can); here the secret is wrong, so the user gets the
    client's own AccessDenied error, naming the object and without the secret."""
    url = seaweed.new_url()
    open_store(url, seaweed.storage_options).write_bytes("obj", b"x" * 1000)
    wrong = {**fault_proxy.storage_options, "secret": "not-the-secret"}
    via = open_store(url, wrong, fetch=FetchConfig(retry=RETRY))
    with pytest.raises(AccessDeniedError, match="obj") as info:
        via.read("obj")
    assert "not-the-secret" not in str(info.value)
    gets = [r for r in fault_proxy.log if r.method == "GET"]
    assert [g.status for g in gets] == [403, 403]
    assert "X-Amz-Signature=" in gets[0].target
    assert "X-Amz-Signature=" not in gets[1].target
    backend = via._get_backend()
    assert isinstance(backend, S3Backend)
    assert backend.direct_fallbacks == 1
    assert via.stats().requests == len(gets) == 2  # the direct GET and the client's


@pytest.mark.parametrize("how", ["env", "config"])
def test_a_configured_proxy_keeps_bodies_with_the_client(
    seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    options = dict(seaweed.storage_options)
    if how == "env":
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the client itself goes direct
    else:
        options["config_kwargs"] = {"proxies": {"https": "http://127.0.0.1:9"}}
    settings = resolve_s3(seaweed.new_url(), options)
    backend = shared_s3_backend(settings, RETRY, 8)
    assert backend.direct is None


def test_direct_reads_off_uses_the_client(seaweed: SeaweedServer, fault_proxy: FaultProxy) -> None:
    plain, via = _stores(seaweed, fault_proxy, direct_reads=False)
    plain.write_bytes("obj", b"abc" * 1000)
    assert via.read("obj") == b"abc" * 1000
    gets = [r for r in fault_proxy.log if r.method == "GET"]
    assert len(gets) == 1
    assert "X-Amz-Signature=" not in gets[0].target


class _TlsRelay:
    """TLS in front of SeaweedFS's plain S3 port: accepts TLS on 127.0.0.1 with a
    self-signed certificate and relays the bytes to the server."""

    def __init__(self, upstream: tuple[str, int], cert: Path, key: Path) -> None:
        self.upstream = upstream
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        for raw in accepted(self.sock, self._stop):
            try:
                tls = self.ctx.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                raw.close()
                continue
            self.handshakes += 1
            up = socket.create_connection(self.upstream)
            self._open += [tls, up]
            for a, b in ((tls, up), (up, tls)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()
                self._threads.append(t)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # shutdown wakes the other direction's blocked recv
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def drop_connections(self) -> None:
        """End the connections open now, as a server's keep-alive timeout would."""
        for s in self._open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(timeout=10)  # no connection is accepted after this
        self.sock.close()
        for s in self._open:  # connections a client keeps alive end here
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in self._threads[1:]:
            t.join(timeout=10)
        for s in self._open:
            s.close()


@pytest.fixture
def tls_relay(seaweed: SeaweedServer, tmp_path: Path) -> Iterator[tuple[_TlsRelay, Path]]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl (Debian's package) is needed to make the test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    relay = _TlsRelay(("127.0.0.1", seaweed.s3_port), cert, key)
    try:
        yield relay, cert
    finally:
        relay.close()


@pytest.mark.parametrize("verify", ["ca-bundle", "off"])
def test_https_bodies_come_direct_with_the_clients_tls_settings(
    seaweed: SeaweedServer, tls_relay: tuple[_TlsRelay, Path], verify: str
) -> None:
    """Over HTTPS the direct path verifies the server as the client does: with the CA
    bundle given in ``client_kwargs["verify"]``, or not at all with ``verify=False``."""
    relay, cert = tls_relay
    url = seaweed.new_url()
    open_store(url, seaweed.storage_options).write_bytes("obj", data := os.urandom(700_000))
    options = {
        **seaweed.storage_options,
        "endpoint_url": f"https://127.0.0.1:{relay.port}",
        "client_kwargs": {"verify": str(cert) if verify == "ca-bundle" else False},
    }
    via = open_store(url, options, fetch=FetchConfig(retry=RETRY))
    out = io.BytesIO()
    assert via.download("obj", out, expected_size=len(data)) == len(data)
    assert out.getvalue() == data
    backend = via._get_backend()
    assert isinstance(backend, S3Backend)
    assert backend.direct is not None
    assert (backend.direct.requests, backend.direct_fallbacks) == (1, 0)


def test_an_https_connection_the_server_closed_is_replaced(
    seaweed: SeaweedServer, tls_relay: tuple[_TlsRelay, Path]
) -> None:
    """A kept-alive TLS connection the server has since closed is replaced by a fresh
    one within the request: the GET succeeds, the policy sees no failure and the
    direct path stays on (a TLS failure outside the handshake never turns it off)."""
    relay, cert = tls_relay
    url = seaweed.new_url()
    open_store(url, seaweed.storage_options).write_bytes("obj", data := os.urandom(300_000))
    options = {
        **seaweed.storage_options,
        "endpoint_url": f"https://127.0.0.1:{relay.port}",
        "client_kwargs": {"verify": str(cert)},
    }
    via = open_store(url, options, fetch=FetchConfig(retry=RETRY))
    assert via.read("obj") == data
    relay.drop_connections()
    assert via.read("obj") == data
    backend = via._get_backend()
    assert isinstance(backend, S3Backend)
    assert backend.direct is not None
    assert (backend.direct.connections, backend.direct_fallbacks) == (2, 0)
    assert via.stats().retries == 0  # replaced within the request, not by the policy


def test_a_server_the_system_does_not_trust_is_refused_over_https(
    seaweed: SeaweedServer, tls_relay: tuple[_TlsRelay, Path]
) -> None:
    """Without the CA bundle, neither path accepts the self-signed server: the direct
    path hands the GET to the client (for good: its TLS settings are what count), whose
    verification fails too, and the user gets a clear error naming the object."""
    relay, _ = tls_relay
    url = seaweed.new_url()
    open_store(url, seaweed.storage_options).write_bytes("obj", b"x" * 1000)
    options = {**seaweed.storage_options, "endpoint_url": f"https://127.0.0.1:{relay.port}"}
    via = open_store(url, options, fetch=FetchConfig(retry=RETRY))
    with pytest.raises(StorageError, match=r"obj.*(?i:certificate)"):
        via.read("obj")
    backend = via._get_backend()
    assert isinstance(backend, S3Backend)
    assert backend.direct is None
    assert backend.direct_fallbacks == 1
