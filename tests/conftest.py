"""Root fixtures: a SeaweedFS S3 server for the session, fresh buckets, a fault proxy,
and a thread-leak guard. The machinery lives in ``tests/support/``."""

from __future__ import annotations

import contextlib
import inspect
import re
import signal
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from support.faultproxy import FaultProxy
from support.leaks import leaked_threads
from support.seaweed import SeaweedServer

# CI machines are small and shared: generation may be slow there, and no test of this
# suite asserts on how fast anything ran (a few bound a wait far above any honest run,
# as a hang guard: tests/cache/test_single_flight.py, tests/test_support_child.py), so
# neither a deadline nor the too-slow health check applies.
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


# What starts another process: a test whose code (or a module-level helper it calls by
# name) says one of these is marked ``proc``; ``make test-fast`` leaves those out.
_PROC = re.compile(
    r"\b(subprocess|multiprocessing|Popen|os\.fork|fork_and|torchrun|unshare|spawn|"
    r"ChildInterpreter|ProcessPool|LocalS3|num_workers=(?!0\b)|workers=[1-9]|ray\.init|"
    r"sys\.executable|mp_context|start_method)\b"
)


def _starts_processes(item: pytest.Item) -> bool:
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    if _PROC.search(source):
        return True
    module = inspect.getmodule(fn)
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\(", source)):
        helper = getattr(module, name, None)
        if inspect.isfunction(helper) and helper.__module__ == fn.__module__:
            with contextlib.suppress(OSError, TypeError):
                if _PROC.search(inspect.getsource(helper)):
                    return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the SeaweedFS server ``s3``, and every test that
    starts processes ``proc``."""
    for item in items:
        if _S3_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)
        if _starts_processes(item):
            item.add_marker(pytest.mark.proc)


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
