"""The loader's shared RAM tier: a disk tier on tmpfs for datasets without ``cache_dir``.

A dataset without a ``cache_dir`` keeps shards in the RAM tier of the process that
reads them, so with DataLoader workers every worker would fetch (and hold) its own
copy, and the loader's process could not map the bytes a worker found. When
:class:`fastload.DataLoader` runs workers over such a dataset it gives the dataset a
private cache directory in shared memory (``/dev/shm`` when it has room for the
dataset's ``ram_limit``, else the system temporary directory), capped at
``ram_limit``: every process of the loader maps the same files, each shard is
fetched once per loader, and the directory is removed when the loader is closed,
garbage collected, or the interpreter exits. A loader killed with SIGKILL leaves it
behind; the next loader on the node removes directories whose owner process is
gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

__all__ = ["SHM_DIR", "make_shared_tier_dir", "remove_shared_tier_dir", "sweep_stale"]

SHM_DIR = "/dev/shm"
_PREFIX = "fastload-loader-"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-[A-Za-z0-9_]+$")


def _room(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(base: str) -> int:
    """Remove the loader directories under ``base`` whose owner process is gone
    (left by a loader killed with SIGKILL); returns how many were removed."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            m = _NAME.match(name)
            if m and not _alive(int(m.group(1))):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                removed += 1
    return removed


def make_shared_tier_dir(need: int) -> str:
    """A fresh private directory (mode 0700) in shared memory if ``/dev/shm`` has
    ``need`` bytes free, else in the temporary directory."""
    base = SHM_DIR if os.path.isdir(SHM_DIR) and _room(SHM_DIR) >= need else None
    base = base or tempfile.gettempdir()
    sweep_stale(base)
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)


def remove_shared_tier_dir(path: str, owner_pid: int) -> None:
    """Remove ``path`` (only from the process that made it: forked children inherit
    the loader object but must not remove its directory)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
