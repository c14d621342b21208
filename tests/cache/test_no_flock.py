"""A cache directory on a filesystem without ``flock`` (some network filesystems) is
refused with a :class:`CacheError` naming the directory and what to do: at
construction, and (should locking break later, an NFS lock service gone) at the first
lock, an eviction's probe or a pin, never a bare ``OSError`` or a misleading timeout.

No filesystem on the test machines refuses ``flock`` (every local one supports it,
and no network or FUSE filesystem can be mounted for the test), so the refusal is made
real by the kernel's side of a real process instead: ``strace``'s fault injection makes
its ``flock`` calls (all of them, or those on one lock file) fail with ENOLCK, as such a
filesystem's would. :func:`flock_failure`, which words the error, is checked for each
errno directly."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.cache import DiskTier, EntryKey, _external, external
from fastload.cache.locks import NO_LOCK_ERRNOS, flock_failure
from fastload.errors import CacheError
from fastload.shards.checksum import xxh3_128

from .conftest import capped_tier

DATA = b"a shard's bytes"

_CHILD = """
import json, sys
from fastload.cache import DiskTier, EntryKey, _external, external
root, checksum, data = sys.argv[1], sys.argv[2], sys.argv[3].encode()
try:
    tier = DiskTier(root, sweep=False)
    path = tier.get(EntryKey("ds", "s.tar", checksum), len(data), lambda f: f.write(data))
    print(json.dumps({"ok": path.read_bytes() == data}))
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.parametrize("err", sorted(NO_LOCK_ERRNOS), ids=errno.errorcode.get)
def test_flock_refused_by_the_filesystem_names_the_directory_and_the_fix(err: int) -> None:
    exc = flock_failure(Path("/mnt/nfs/cache"), err, "/mnt/nfs/cache/locks/x.lock: refused")
    assert isinstance(exc, CacheError)
    message = str(exc)
    assert "/mnt/nfs/cache" in message
    assert "does not support flock" in message
    assert "/mnt/nfs/cache/locks/x.lock: refused" in message
    assert "local filesystem" in message


def test_another_flock_failure_is_reported_as_it_is() -> None:
    exc = flock_failure(Path("/data/cache"), errno.EIO, "/data/cache/locks/x.lock: I/O error")
    assert isinstance(exc, CacheError)
    assert "does not support flock" not in str(exc)
    assert "/data/cache" in str(exc)
    assert "I/O error" in str(exc)


def _strace_injects() -> str | None:
    """Why ``strace -e inject`` cannot be used here, or None when it can."""
    strace = shutil.which("strace")
    if strace is None:
        return "strace is not installed"
    probe = subprocess.run(
        [strace, "-f", "-qq", "-o", os.devnull, "-e", "trace=getppid", "-e",
         "inject=getppid:retval=4242", sys.executable, "-c", "import os; print(os.getppid())"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if probe.stdout.strip() != "4242":
        return f"strace cannot inject faults here: {probe.stderr.strip()[-300:]}"
    return None


def _run_refused(
    root: Path, only: Path | None, data: bytes = DATA, code: str = _CHILD
) -> dict[str, object]:
    """Run ``code`` (default :data:`_CHILD`: it fetches ``data`` as ``s.tar``) on
    ``root`` with every ``flock`` (or, with ``only``, those on that file) failing with
    ENOLCK; its outcome."""
    why = _strace_injects()
    if why is not None:
        pytest.skip(why)
    strace = ["strace", "-f", "-qq", "-o", os.devnull]
    if only is not None:
        strace += ["-P", str(only)]
    strace += ["-e", "trace=flock", "-e", "inject=flock:error=ENOLCK"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [*strace, sys.executable, "-c", code, str(root), xxh3_128(data), data.decode()],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_cache_dir_without_flock_is_refused_at_construction(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    got = _run_refused(root, only=None)
    assert got["type"] == "CacheError", got
    message = str(got["message"])
    assert f"the filesystem of the cache directory {root} does not support flock" in message
    assert "No locks available" in message
    assert "local filesystem" in message


def test_locking_that_breaks_after_construction_is_a_cache_error(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)  # locking works here: constructed, the probe passed
    key = EntryKey("ds", "s.tar", xxh3_128(DATA))
    lock = tier.locks.path(key.flat)
    tier.close()
    got = _run_refused(root, only=lock)
    assert got["type"] == "CacheError", got  # before: a bare OSError out of get()
    message = str(got["message"])
    assert f"cache directory {root} does not support flock" in message
    assert str(lock) in message
    # nothing was published or left reserved; a process that can lock fetches it
    after = DiskTier(root)
    assert after.verify() == []
    assert after.get(key, len(DATA), lambda f: f.write(DATA)).read_bytes() == DATA
    after.close()


def test_locking_that_breaks_in_an_eviction_is_a_cache_error(tmp_path: Path) -> None:
    # the cap holds one entry: fetching a second evicts the first, whose probe (an
    # exclusive flock on its file, without blocking) fails: before, a bare OSError
    root = tmp_path / "cache"
    old, new = b"o" * 60000, b"n" * 60000
    tier = capped_tier(root, 60000)
    old_key = EntryKey("ds", "old.tar", xxh3_128(old))
    assert tier.get(old_key, len(old), lambda f: f.write(old)).read_bytes() == old
    old_file = tier.path_for(old_key)
    tier.close()
    got = _run_refused(root, only=old_file, data=new)
    assert got["type"] == "CacheError", got
    message = str(got["message"])
    assert f"cache directory {root} does not support flock" in message
    assert str(old_file) in message
    # nothing half-done: the old entry is whole and served; a process that can lock
    # evicts it for the new one
    after = DiskTier(root)
    assert after.verify() == []
    assert after.get(old_key, len(old), lambda f: f.write(b"x")).read_bytes() == old
    new_key = EntryKey("ds", "s.tar", xxh3_128(new))
    assert after.get(new_key, len(new), lambda f: f.write(new)).read_bytes() == new
    assert not old_file.exists()
    after.close()


_PIN_CHILD = """
import json, sys
from pathlib import Path
from fastload.cache import DiskTier, external
root = Path(sys.argv[1])
try:
    tier = DiskTier(root, sweep=False)
    held = external.pin(tier, "items", root / "cached" / "f.bin")
    print(json.dumps({"pinned": held is not None}))
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
"""


def test_locking_that_breaks_in_a_pin_of_a_file_entry_is_a_cache_error(tmp_path: Path) -> None:
    # an entry fastload writes beside the shards (a cached() item shard, a token
    # directory) is pinned by a shared flock on its pin file: before, a failing flock
    # there came out of external.pin as a bare OSError
    root = tmp_path / "cache"
    tier = DiskTier(root)
    path = root / "cached" / "f.bin"
    path.parent.mkdir()
    reservation = external.FileReservation.open(tier, "items", path, 4096)
    assert reservation is not None
    path.write_bytes(b"f" * 4096)
    reservation.seal()
    name = _external.external_name("items", "cached/f.bin")
    pin_file = _external.pin_path(tier.lock_dir, name)
    tier.close()
    got = _run_refused(root, only=pin_file, code=_PIN_CHILD)
    assert got["type"] == "CacheError", got
    message = str(got["message"])
    assert f"cache directory {root} does not support flock" in message
    assert str(pin_file) in message
    after = DiskTier(root)
    held = external.pin(after, "items", path)  # a process that can lock pins it
    assert held is not None
    held.release()
    assert path.read_bytes() == b"f" * 4096
    after.close()
