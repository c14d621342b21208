"""Root fixtures: a SeaweedFS S3 server for the session, fresh buckets, a fault proxy,
and a thread-leak guard. The machinery lives in ``tests/support/``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from support.faultproxy import FaultProxy
from support.leaks import leaked_threads
from support.seaweed import SeaweedServer

# CI machines are small and shared: generation may be slow there, and no test of this
# suite asserts on time, so neither a deadline nor the too-slow health check applies.
settings.register_profile("fastload", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fastload")

_S3_FIXTURES = {"seaweed", "s3_url", "fault_proxy"}

# A suite started in the background of a non-interactive shell (`make test &`, nohup)
# inherits SIGINT ignored, and so would every process it forks or execs: the tests that
# press Ctrl-C in a child (tests/cache/test_cancel.py, tests/convert/test_safe_convert.py)
# would then see no interrupt at all. Python's own handler here gives forked children
# KeyboardInterrupt and exec'd ones the default action, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the SeaweedFS server ``s3``."""
    for item in items:
        if _S3_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A SeaweedFS server with an S3 gateway on 127.0.0.1 for the whole session.

    Has ``endpoint_url``, ``access_key``, ``secret_key``, ``storage_options`` (for
    ``fastload.storage.open_store``), ``s3fs_options()``, ``new_bucket()`` and
    ``new_url(path)``.
    """
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_url(seaweed: SeaweedServer) -> str:
    """``s3://<fresh bucket>/data`` on the session's SeaweedFS."""
    return seaweed.new_url("data")


@pytest.fixture
def fault_proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    """A fault-injecting TCP proxy in front of SeaweedFS's S3 port (no faults until
    ``set_faults``); ``storage_options`` carries the credentials and the proxy's URL."""
    proxy = FaultProxy(("127.0.0.1", seaweed.s3_port), base_options=seaweed.storage_options).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def no_thread_leaks() -> Iterator[None]:
    """Fail the test if it leaves threads running (fsspec's IO thread excepted)."""
    before = set(threading.enumerate())
    yield
    leaked = leaked_threads(before)
    if leaked:
        pytest.fail(f"test left threads running: {leaked}")
