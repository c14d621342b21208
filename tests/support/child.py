"""Test code run in a child interpreter, so that a native crash there (Ray's core worker
aborting, a segfault) fails the one test instead of killing the whole pytest run.

:class:`ChildInterpreter` keeps one fresh ``sys.executable`` process (its own session,
stdout and stderr to a log file) and runs module-level functions in it one at a
time: ``child.call(fn, *args, **kwargs)`` pickles the call by reference, returns
what ``fn`` returned, and raises what it raised (unpickled, chained from a
:class:`ChildTraceback` that holds the child's traceback; a :class:`ChildError`
with the same text when the exception does not pickle). If the child dies or
overruns ``timeout_s``, the call fails the test with the child's exit code and the
tail of its output; its process group is killed, and the next call starts a new
child (running ``on_start`` again). Whatever the child printed during a call is
copied to ``sys.stderr`` afterwards, where pytest captures it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import IO, Any, NoReturn, TypeVar

import pytest

__all__ = ["ChildError", "ChildInterpreter", "ChildTraceback"]

T = TypeVar("T")

# The child's first message is the parent's sys.path (so the same modules import by
# the same names); the socket is made non-inheritable again, so that no process the
# child starts holds it open past the child's death.
_BOOTSTRAP = """\
import os, sys
from multiprocessing.connection import Connection
fd = int(sys.argv[1])
os.set_inheritable(fd, False)
conn = Connection(fd)
sys.path[:] = conn.recv()
from support.child import _serve
_serve(conn)
"""

_TAIL_CHARS = 6000  # of the child's output, in a failure message
_ECHO_CHARS = 50_000  # of the child's output per call, copied to sys.stderr


class ChildTraceback(Exception):
    """The traceback, as text, of an exception raised in the child."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


class ChildError(Exception):
    """An exception raised in the child that could not be sent back as itself."""


class ChildInterpreter:
    """One child interpreter at a time; see the module docstring.

    ``on_start`` runs in each new child before its first call (its failure fails
    that call); ``on_close`` runs in the child when :meth:`close` is called.
    ``start_timeout_s`` bounds ``on_start``, ``timeout_s`` every call (keep their
    sum under pytest-timeout's limit, which ends the whole run).
    """

    def __init__(
        self,
        name: str,
        *,
        on_start: Callable[[], object] | None = None,
        on_close: Callable[[], object] | None = None,
        start_timeout_s: float = 120.0,
        timeout_s: float = 150.0,
    ) -> None:
        self.name = name
        self.on_start = on_start
        self.on_close = on_close
        self.start_timeout_s = start_timeout_s
        self.timeout_s = timeout_s
        self.starts = 0  # children started so far
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> ChildInterpreter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first call or after a death)."""
        return None if self._proc is None else self._proc.pid

    def call(
        self, fn: Callable[..., T], /, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> T:
        """``fn(*args, **kwargs)`` in the child; see the module docstring."""
        if self._proc is None:
            self._start()
            if self.on_start is not None:
                self._call(self.on_start, (), {}, self.start_timeout_s, "on_start")
        label = getattr(fn, "__qualname__", repr(fn))
        limit = self.timeout_s if timeout_s is None else timeout_s
        result: T = self._call(fn, args, kwargs, limit, label)
        return result

    def close(self) -> None:
        """Run ``on_close`` in the child and let it exit (killed after 60 s); an error
        of ``on_close`` or a non-zero exit code fails the test after the child is gone."""
        if self._proc is None:
            return
        error: Exception | None = None
        if self.on_close is not None:
            try:
                self._call(self.on_close, (), {}, 60.0, "on_close")
            except Exception as exc:  # raised again once the child has exited
                error = exc
        if self._proc is not None:  # None if on_close killed it (the test failed then)
            assert self._conn is not None
            proc = self._proc
            with contextlib.suppress(OSError):
                self._conn.send_bytes(b"")  # the end of the calls
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._fail("did not exit within 60 s of close()", "close", kill=True)
            self._discard()
            if rc != 0 and error is None:
                pytest.fail(
                    f"child interpreter {self.name!r} exited with code {_describe(rc)} on close"
                )
        if error is not None:
            raise error

    # -- the parent's side -----------------------------------------------------------

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        # open for the child's life; closed (and so deleted) by _discard
        self._log = tempfile.TemporaryFile(prefix="fastload-child-")  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed whole on failure
            )
        except BaseException:
            ours.close()
            self._log.close()
            self._log = None
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(list(sys.path))
        self.starts += 1

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout_s: float,
        label: str,
    ) -> Any:
        assert self._conn is not None
        assert self._log is not None
        start = self._log.seek(0, os.SEEK_END)
        self._conn.send_bytes(pickle.dumps((fn, args, kwargs)))
        deadline = time.monotonic() + timeout_s
        reply = None
        while reply is None:
            try:
                if self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                    reply = pickle.loads(self._conn.recv_bytes())
                    continue
            except (EOFError, OSError):  # its end closed: it exited
                break
            if time.monotonic() >= deadline:
                self._fail(f"did not finish {label} within {timeout_s:g} s", label, start, True)
        if reply is None:
            self._fail(f"died while running {label}", label, since=start)
        self._echo(start)
        if reply[0] == "ok":
            return reply[1]
        _, exc_bytes, summary, tb = reply
        exc: BaseException | None = None
        if exc_bytes is not None:
            with contextlib.suppress(Exception):
                exc = pickle.loads(exc_bytes)
        if not isinstance(exc, BaseException):
            raise ChildError(f"{summary} (in child interpreter {self.name!r})\n{tb}")
        raise exc from ChildTraceback(tb)

    def _fail(self, what: str, label: str, since: int = 0, kill: bool = False) -> NoReturn:
        """Kill the child's process group, reap it and fail the test with its exit
        code and output tail; the next call starts a new child."""
        assert self._proc is not None
        assert self._log is not None
        proc = self._proc
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # it is not reaped: the group is its own
        try:
            rc: int | None = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it started and left behind
        if rc is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        tail = self._read(since)[-_TAIL_CHARS:]
        self._discard()
        pytest.fail(
            f"child interpreter {self.name!r} (pid {proc.pid}) {what}: "
            f"exit code {_describe(rc)}; the last of its output:\n{tail}",
            pytrace=False,
        )

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._log is not None:
            self._log.close()
        self._proc = self._conn = self._log = None

    def _read(self, since: int) -> str:
        assert self._log is not None
        self._log.seek(since)
        return self._log.read().decode("utf-8", "replace")

    def _echo(self, since: int) -> None:
        text = self._read(since)
        if text:
            sys.stderr.write(f"[child {self.name}]\n{text[-_ECHO_CHARS:]}")


def _describe(rc: int | None) -> str:
    if rc is None:
        return "none (still running after SIGKILL and 30 s)"
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"{rc} ({signal.Signals(-rc).name})"
    return str(rc)


# -- the child's side ----------------------------------------------------------------


def _serve(conn: Connection) -> None:
    """Run the calls that arrive on ``conn`` until an empty message or EOF."""
    while True:
        try:
            request = conn.recv_bytes()
        except EOFError:
            return
        if not request:
            return
        try:
            fn, args, kwargs = pickle.loads(request)
            reply: tuple[Any, ...] = ("ok", fn(*args, **kwargs))
            payload = pickle.dumps(reply)
        except BaseException as exc:
            tb = traceback.format_exc()
            summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            try:
                exc_bytes: bytes | None = pickle.dumps(exc)
            except Exception:
                exc_bytes = None
            payload = pickle.dumps(("raised", exc_bytes, summary, tb))
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send_bytes(payload)
