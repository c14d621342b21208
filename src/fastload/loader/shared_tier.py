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
behind; the next loader on the node removes directories whose owner is gone. Liveness
is a lease, not a PID (PIDs repeat across containers): the owner holds an exclusive
``flock`` on the directory's ``.lease`` file for as long as it lives, and the kernel
drops it when the process (and the workers that inherited it) are gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
import weakref
from typing import Any

__all__ = [
    "SHM_DIR",
    "is_lent",
    "lend_shared_tier",
    "make_shared_tier_dir",
    "remove_shared_tier_dir",
    "sweep_stale",
]

SHM_DIR = "/dev/shm"
_PREFIX = "fastload-loader-"
_NAME = re.compile(rf"^{_PREFIX}\d+-[A-Za-z0-9_]+$")
_LEASE = ".lease"
#: A directory with no lease file yet is being made: left alone for this long.
_GRACE_S = 60.0


def _room(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _abandoned(directory: str) -> bool:
    """Whether nobody holds the lease of the loader directory ``directory``."""
    try:
        fd = os.open(os.path.join(directory, _LEASE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return time.time() - os.lstat(directory).st_mtime > _GRACE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the lock just taken
    return True


def sweep_stale(base: str) -> int:
    """Remove the loader directories under ``base`` whose lease nobody holds (left by
    a loader killed with SIGKILL); returns how many were removed."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if _NAME.match(name) and not os.path.islink(path) and _abandoned(path):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
    return removed


def make_shared_tier_dir(need: int) -> tuple[str, int]:
    """A fresh private directory (mode 0700) in shared memory if ``/dev/shm`` has
    ``need`` bytes free, else in the temporary directory, and the descriptor of its
    held lease (keep it open for as long as the directory is in use)."""
    base = SHM_DIR if os.path.isdir(SHM_DIR) and _room(SHM_DIR) >= need else None
    base = base or tempfile.gettempdir()
    sweep_stale(base)
    path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)
    fd = os.open(
        os.path.join(path, _LEASE),
        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def remove_shared_tier_dir(path: str, owner_pid: int, lease: int) -> None:
    """Remove ``path`` and let its lease go (only from the process that made it:
    forked children inherit the loader object but must not remove its directory)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(lease)


#: The cache settings of the sources a loader moved onto its shared tier, as they were
#: given: restored by the end of the last loader whose tier the source reads from.
_LENT: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def is_lent(source: Any) -> bool:
    """Whether ``source`` reads from the shared tier of an earlier loader (still alive:
    ``loader = DataLoader(...)`` each epoch); False for None or any other object."""
    try:
        return source in _LENT
    except TypeError:  # not weakly referenceable: never lent
        return False


def lend_shared_tier(owner: object, source: Any) -> tuple[str, weakref.finalize]:
    """Move ``source`` (a ``ShardSource``) onto a fresh shared tier for the loader
    ``owner``: capped at its ``ram_limit``, sized for at most its dataset's bytes.
    Returns the tier's path and the finalizer that ends it (run by the owner's
    ``close()``, its collection, or the interpreter's exit): it gives the source back
    the settings it was given, if it still reads from this tier, and removes the tier."""
    limit = int(source.cache_config.ram_limit)
    need = min(limit, int(source.manifest.total_bytes))
    path, lease = make_shared_tier_dir(need)
    if not is_lent(source):
        _LENT[source] = source.__getstate__()  # its settings, as given
    source.use_cache_dir(path, limit)
    return path, weakref.finalize(owner, _end_shared_tier, source, path, os.getpid(), lease)


def _end_shared_tier(source: Any, path: str, owner_pid: int, lease: int) -> None:
    """A loader's end (``close()``, collection, exit) in the process that made its
    shared tier: if ``source`` still reads from it, close what it has open there and
    give it back its own settings (so the dataset, used alone or by a later loader,
    does not recreate the removed directory), then remove the tier."""
    if os.getpid() == owner_pid and source.cache_dir == path:
        source.close()
        original = _LENT.pop(source, None)
        if original is not None:
            source.__setstate__(original)  # its settings and fresh per-process state
    remove_shared_tier_dir(path, owner_pid, lease)
