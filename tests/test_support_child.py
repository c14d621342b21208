"""``support.child.ChildInterpreter``: what the Ray tests rely on to survive an abort
of Ray's core worker. Values and exceptions come back as themselves; a child that
dies or overruns fails the call with its exit code and output tail, its process
group is killed, and the next call starts a new child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.child import ChildError, ChildInterpreter, ChildTraceback

_started: list[int] = []  # in the child: the pids on_start ran in


def _on_start() -> None:
    _started.append(os.getpid())


def _started_in() -> list[int]:
    return _started


def _add(a: int, b: int, *, c: int = 0) -> int:
    return a + b + c


def _raise_key_error(key: str) -> None:
    raise KeyError(key)


class _Unpicklable(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


def _raise_unpicklable() -> None:
    raise _Unpicklable("one", "two")


def _print_and_abort(text: str) -> None:
    print(text, flush=True)
    os.abort()


def _start_sleeper_and_hang(pid_file: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(pid_file).write_text(str(proc.pid))
    time.sleep(120)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie not yet reaped
    except FileNotFoundError:
        return True


def test_values_and_exceptions_come_back_as_themselves() -> None:
    with ChildInterpreter("t", on_start=_on_start) as child:
        assert child.call(_add, 1, 2, c=3) == 6
        assert child.pid is not None
        assert child.pid != os.getpid()
        with pytest.raises(KeyError, match="missing") as info:
            child.call(_raise_key_error, "missing")
        assert isinstance(info.value.__cause__, ChildTraceback)
        assert "_raise_key_error" in str(info.value.__cause__)
        with pytest.raises(ChildError, match="_Unpicklable: one/two"):
            child.call(_raise_unpicklable)
        assert child.call(_started_in) == [child.pid]  # on_start once, in the child
        assert child.starts == 1


def test_an_abort_fails_the_call_and_the_next_call_gets_a_new_child() -> None:
    with ChildInterpreter("t", on_start=_on_start) as child:
        first = child.call(_started_in)
        with pytest.raises(pytest.fail.Exception) as info:
            child.call(_print_and_abort, "last words")
        message = str(info.value)
        assert "died while running _print_and_abort" in message
        assert f"exit code -{int(signal.SIGABRT)} (SIGABRT)" in message
        assert "last words" in message
        assert child.pid is None
        second = child.call(_started_in)
        assert second != first
        assert second == [child.pid]
        assert child.starts == 2


def test_an_overrun_kills_the_childs_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with ChildInterpreter("t") as child:
        started = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match=r"did not finish .* within 3 s"):
            child.call(_start_sleeper_and_hang, str(pid_file), timeout_s=3)
        assert time.monotonic() - started < 30
        sleeper = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while not _gone(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(sleeper)
        assert child.call(_add, 2, 2) == 4
