"""Helpers of the security tests: an attacker that is really another uid, planted
pickles that leave a mark when unpickled, and a private config directory per test."""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: The attacker's uid and gid (``nobody`` on Linux).
ATTACKER = 65534

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacker is another uid: needs root to switch to it"
)


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config directory (where cached() keeps its key), outside any cache."""
    d = tmp_path / "home-config"
    monkeypatch.setenv("FASTLOAD_CONFIG_DIR", str(d))
    monkeypatch.delenv("FASTLOAD_STORAGE_OPTIONS", raising=False)
    return d


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A fresh ``1777`` directory that every local user can reach (like ``/tmp`` or a
    shared ``hostPath``); pytest's own temp dirs are private to root."""
    d = Path(tempfile.mkdtemp(prefix="fastload-security-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_attacker(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a forked child that has switched to the attacker's uid and gid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(ATTACKER)
            os.setuid(ATTACKER)
            os.umask(0)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's part failed"


class Marker:
    """Unpickling an instance creates ``path``: proof that planted code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))
