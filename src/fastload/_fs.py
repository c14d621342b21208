"""Files and directories fastload must be able to trust: ownership, modes, no symlinks.

The trust rule for everything fastload keeps on a node (the shard cache, the item
cache of :func:`fastload.cached`, the key that authenticates cached items):

* directories are created ``0700`` and files ``0600`` whatever the umask;
* a directory that fastload uses is refused (:class:`UnsafePathError`, naming it and
  the fix) when another user owns it or when group or others may write to it, since
  anyone who can write there can plant files the process will read or delete;
* files are opened with ``O_NOFOLLOW`` (a planted symlink is refused, never followed)
  and created with ``O_EXCL``.

``shared=True`` is the opt-in for one group that trusts itself (pods of one team on a
node): directories ``2770`` and files ``0660``, other owners and group write allowed,
write by others still refused. Pure helpers over :mod:`os`; the callers decide what
each path is.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fastload.errors import CacheError, UnsafePathError

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SHARED_DIR_MODE",
    "SHARED_FILE_MODE",
    "UnsafePathError",
    "atomic_write_bytes",
    "atomic_writer",
    "check_dir",
    "check_file",
    "contained_path",
    "dir_mode",
    "file_mode",
    "make_dirs",
    "open_nofollow",
    "umask",
]

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
SHARED_DIR_MODE = 0o2770  # setgid: new entries keep the directory's group
SHARED_FILE_MODE = 0o660


def dir_mode(shared: bool) -> int:
    """The mode fastload gives the directories it creates."""
    return SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE


def file_mode(shared: bool) -> int:
    """The mode fastload gives the files it creates in a trusted directory."""
    return SHARED_FILE_MODE if shared else PRIVATE_FILE_MODE


def _owner_problem(st: os.stat_result, shared: bool) -> str | None:
    euid = os.geteuid()
    if not shared and st.st_uid != euid:
        return (
            f"is owned by uid {st.st_uid}, not by you (uid {euid}): another user could "
            "plant files in it"
        )
    if st.st_mode & stat.S_IWOTH:
        return f"has mode {stat.S_IMODE(st.st_mode):o}: every local user may write to it"
    if not shared and st.st_mode & stat.S_IWGRP:
        return f"has mode {stat.S_IMODE(st.st_mode):o}: its group may write to it"
    return None


def _fix(path: str | os.PathLike[str], is_dir: bool, shared: bool) -> str:
    mode = ("2770" if shared else "700") if is_dir else ("660" if shared else "600")
    alt = (
        " or pass shared=True (CLI: --shared) if everyone in its group is trusted"
        if not shared
        else ""
    )
    return (
        f"; use a directory of your own, or `chown` it to yourself and `chmod {mode} {path}`{alt}"
    )


def check_dir(
    path: str | os.PathLike[str], *, shared: bool = False, follow: bool = False
) -> os.stat_result:
    """Check that ``path`` is a directory fastload may trust; return its ``stat``.

    With ``follow`` the path may be a symlink (the top of a cache directory that a
    user points elsewhere), but then the link itself must be owned by the current
    user or root, so one planted by someone else in ``/tmp`` is refused. Raises
    :class:`UnsafePathError` naming the path, what is wrong and the fix.
    """
    try:
        lst = os.lstat(path)
        if stat.S_ISLNK(lst.st_mode):
            if not follow:
                raise UnsafePathError(
                    f"{path}: is a symlink; fastload does not follow "
                    "symlinks inside its cache directory"
                )
            if lst.st_uid not in (os.geteuid(), 0):
                raise UnsafePathError(
                    f"{path}: is a symlink owned by uid {lst.st_uid}, not by you or root"
                    + _fix(path, True, shared)
                )
        st = os.stat(path) if follow else lst
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnsafePathError(f"{path}: cannot check this directory: {exc}") from exc
    return _trusted(st, path, True, shared)


def check_file(fd: int, path: str | os.PathLike[str], *, shared: bool = False) -> os.stat_result:
    """Check the open file ``fd`` (of ``path``) is a regular file fastload may trust:
    owned by the current user (any owner when ``shared``), not writable by others
    (nor by the group unless ``shared``). Returns its ``fstat``; raises
    :class:`UnsafePathError`."""
    return _trusted(os.fstat(fd), path, False, shared)


def _trusted(
    st: os.stat_result, path: str | os.PathLike[str], is_dir: bool, shared: bool
) -> os.stat_result:
    """``st`` (of ``path``) if it is a directory (``is_dir``, else a regular file) with
    an owner and permissions fastload may trust; raises :class:`UnsafePathError`."""
    if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
        raise UnsafePathError(f"{path}: is not a {'directory' if is_dir else 'regular file'}")
    problem = _owner_problem(st, shared)
    if problem is not None:
        raise UnsafePathError(f"{path}: {problem}" + _fix(path, is_dir, shared))
    return st


def make_dirs(
    path: str | os.PathLike[str], *, top: str | os.PathLike[str] | None = None, shared: bool = False
) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 (``2770`` when ``shared``)
    whatever the umask, then check every directory from ``top`` (default: ``path``
    itself) down to ``path`` with :func:`check_dir`; ``top`` may be a symlink of
    the current user. Returns ``path`` as a :class:`Path`. Raises
    :class:`UnsafePathError` for an untrusted directory, :class:`CacheError` when one
    cannot be created."""
    target = Path(path)
    root = Path(top) if top is not None else target
    try:
        rel = target.relative_to(root)
    except ValueError:
        raise CacheError(f"{target} is not inside {root}") from None
    mode = dir_mode(shared)
    # Nothing is created inside a directory before it has passed the checks.
    _make_dir(root, mode, parents=True)
    check_dir(root, shared=shared, follow=True)
    p = root
    for part in rel.parts:
        p = p / part
        _make_dir(p, mode, parents=False)
        check_dir(p, shared=shared)
    return target


def _make_dir(path: Path, mode: int, parents: bool) -> None:
    if os.path.lexists(path):
        return
    if parents and not os.path.lexists(path.parent) and path.parent != path:
        _make_dir(path.parent, mode, parents=True)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return  # another process made it: checked like any existing one
    except OSError as exc:
        raise CacheError(f"cannot create the directory {path}: {exc}") from exc
    with contextlib.suppress(OSError):
        # mkdir applied the umask (which only removes bits): set exactly our mode
        os.chmod(path, mode, follow_symlinks=False)


def open_nofollow(
    path: str | os.PathLike[str],
    flags: int,
    *,
    shared: bool = False,
    dir_fd: int | None = None,
    check: bool = True,
) -> int:
    """``os.open`` that never follows a symlink at ``path``; a created file gets mode
    0600 (0660 when ``shared``) whatever the umask. With ``check`` an opened file is
    checked with :func:`check_file`. Returns the fd. Raises :class:`UnsafePathError`
    for a symlink or an untrusted file, ``OSError`` otherwise (``FileExistsError``
    with ``O_EXCL``, ``FileNotFoundError`` without ``O_CREAT``)."""
    mode = file_mode(shared)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symlink
            raise UnsafePathError(f"{path}: is a symlink; fastload does not follow it") from None
        raise
    try:
        if flags & os.O_CREAT and flags & os.O_EXCL:
            os.fchmod(fd, mode)  # ours: the umask may have taken bits we want
        if check:
            check_file(fd, path, shared=shared)
    except BaseException:
        os.close(fd)
        raise
    return fd


def umask() -> int:
    """This process's umask, read without changing it (``/proc``), else 0o022."""
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview, mode: int | None = None
) -> None:
    """Write ``data`` to ``path`` atomically: a ``mkstemp`` file in the target's
    directory (unpredictable name, ``O_EXCL``, never a planted symlink), fsynced, then
    ``os.replace``. ``mode`` defaults to 0666 minus the umask, like ``open("wb")``."""
    with atomic_writer(path, mode) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: int | None = None) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``path`` (as :func:`atomic_write_bytes`) when the
    ``with`` block ends without an error; on an error nothing is left behind."""
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), (0o666 & ~umask()) if mode is None else mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def contained_path(root: str | os.PathLike[str], name: str) -> str | None:
    """``root`` joined with the relative ``name``, or ``None`` when ``name`` would leave
    ``root`` (absolute, ``..`` components, a NUL byte, or empty). Lexical: symlinks
    inside ``root`` are the owner's choice and are not resolved."""
    if not isinstance(name, str) or not name or "\0" in name or os.path.isabs(name):
        return None
    norm = os.path.normpath(name)
    if norm == "." or norm == ".." or norm.startswith("../") or os.path.isabs(norm):
        return None
    return os.path.join(os.fspath(root), norm)
