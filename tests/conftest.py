"""Root fixtures: a SeaweedFS S3 server for the session, fresh buckets, a fault proxy,
and a thread-leak guard. The machinery lives in ``tests/support/``. Also the rule that
leaves out, visibly, the tests that need torch or DALI where they are not installed
(CI's Python 3.10 leg)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import signal
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from fastload.errors import MissingDependencyError
from support import torchvision_shim
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

# torchvision through the shim (tests/support/torchvision_shim.py: the registry's wheel
# does not load beside the CPU torch), here and in every child process: the hook imports
# nothing until something imports torchvision (transformers does, whenever it is there).
torchvision_shim.register()
_SITE = str(Path(__file__).parent / "support" / "site")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_SITE, os.environ.get("PYTHONPATH", "")) if p
)

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the SeaweedFS server ``s3``, and every test that
    starts processes ``proc``; where torch is absent, deselect the tests marked
    ``torch``."""
    for item in items:
        if _S3_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)
        if _starts_processes(item):
            item.add_marker(pytest.mark.proc)
        if item.nodeid.startswith(_NEEDS_TORCH):
            item.add_marker(pytest.mark.torch)
    if "torch" in _ABSENT:
        kept = [item for item in items if item.get_closest_marker("torch") is None]
        dropped = [item for item in items if item.get_closest_marker("torch") is not None]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            _LEFT_OUT.deselected += len(dropped)
            items[:] = kept


# --- The tests that need torch or DALI, where these are not installed ---------------
#
# CI's second leg (make test-py310) runs the suite on the lowest supported Python
# without torch and DALI: the core imports and works without them (docs/design.md).
# There, and only where the package is absent (on the main leg every test runs and
# every failure counts), a test is left out, and counted in the closing summary, when
#   - its module cannot be imported for lack of it (the file is reported skipped),
#   - it fails because it reached code that needs it: a ModuleNotFoundError naming one
#     of its modules, or fastload's MissingDependencyError naming one of its extras
#     (the test is reported skipped, with the error),
#   - it is marked ``torch`` (deselected): a test that needs torch without failing on
#     an import, listed in _NEEDS_TORCH.
# Any other failure still fails. `import fastload` and the core packages must import
# without torch (checked before collection), and a run that passes nothing fails.

_FAMILIES = {
    # family: (the module whose absence turns the rule on, modules, extras)
    "torch": ("torch", {"torch", "torchvision", "torchdata"}, {"torch", "gpu"}),
    "DALI": ("nvidia.dali", {"nvidia", "wds2idx"}, {"dali"}),
}

# Tests (node ids, or a file for all of its tests) that need torch but, without it, would
# fail on an assertion rather than on an import: the check is in a child process, or on
# a value.
_NEEDS_TORCH = (
    "tests/bench/test_bench_s3.py",  # runs `fastload bench` (extra bench: torch's loader)
    "tests/bench/test_tiers.py::test_machine_info_has_the_facts",  # torch's version
    # benchmarks/gpu/gpu_check.py in a child process: the GPU check of fastload.loader
    "tests/gpu/test_gpu_check.py::"
    "test_the_restricted_environment_really_lacks_the_extension_and_dali",
    "tests/gpu/test_gpu_check.py::test_a_failing_section_is_recorded_and_the_next_ones_still_run",
    "tests/gpu/test_gpu_check.py::test_sections_that_do_not_fit_the_budget_are_skipped",
)

# The core (docs/design.md, "Layers"): imports without torch, DALI, s3fs or CUDA.
_CORE = (
    "fastload",
    "fastload.errors",
    "fastload.config",
    "fastload.storage",
    "fastload.shards",
    "fastload.cache",
    "fastload.sampling",
    "fastload.convert",
    "fastload.decode",
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is absent
        return False


_ABSENT = {family for family, (probe, _, _) in _FAMILIES.items() if not _installed(probe)}


class _LeftOut:
    def __init__(self) -> None:
        self.files: list[str] = []
        self.tests: list[str] = []
        self.deselected = 0
        self.passed = 0


_LEFT_OUT = _LeftOut()


def _absent_cause(exc: BaseException | None) -> str | None:
    """The absent family that ``exc``, or what it was raised from, is for, if any. Not
    what it was raised while handling: a fallback for a missing torch that then fails
    is a failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for family in _ABSENT:
            _, modules, extras = _FAMILIES[family]
            if isinstance(exc, MissingDependencyError) and exc.extra in extras:
                return family
            if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in modules:
                return family
        exc = exc.__cause__
    return None


class _Module(pytest.Module):
    """A test module whose import may fail for lack of torch or DALI."""

    left_out: str | None = None

    def _getobj(self) -> object:
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as exc:
            family = _absent_cause(exc.__cause__)
            if family is None:
                raise
            self.left_out = f"needs {family}, not installed here ({exc.__cause__})"
            _LEFT_OUT.files.append(self.nodeid)
            raise pytest.skip.Exception(self.left_out, allow_module_level=True) from None


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _Module.from_parent(parent, path=module_path)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    report = yield
    left_out = getattr(collector, "left_out", None)
    if left_out and report.skipped:  # located at the test file, not here
        report.longrepr = (str(collector.path), 1, f"Skipped: {left_out}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    family = _absent_cause(call.excinfo.value) if report.failed and call.excinfo else None
    if family is not None:
        exc = call.excinfo.value if call.excinfo else None
        report.outcome = "skipped"
        reason = f"needs {family}, not installed here ({type(exc).__name__}: {exc})"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"Skipped: {reason}")
        _LEFT_OUT.tests.append(item.nodeid)
    elif report.when == "call" and report.passed:
        _LEFT_OUT.passed += 1
    return report


def pytest_configure(config: pytest.Config) -> None:
    if not _ABSENT:
        return
    for name in _CORE:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise pytest.UsageError(
                f"{name} does not import without {', '.join(sorted(_ABSENT))}: {exc!r}"
            ) from exc


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _ABSENT and _LEFT_OUT.passed == 0 and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # everything left out is no pass


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _ABSENT:
        return
    left = _LEFT_OUT
    terminalreporter.write_sep(
        "=",
        f"without {' and '.join(sorted(_ABSENT))} (not installed): {left.passed} passed; left "
        f"out: {len(left.files)} test files that import them, {len(left.tests)} tests that "
        f"reached them (skipped), {left.deselected} marked torch (deselected)",
    )
    if left.passed == 0:
        terminalreporter.write_line("no test passed: a run that leaves out everything fails")


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
