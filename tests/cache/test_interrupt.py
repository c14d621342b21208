"""Ctrl-C acts while the catalog is busy. A process that waits for the catalog's write
lock (another process is stopped with SIGSTOP inside a write), or to open a catalog
another process is creating, waits in short slices, so an interrupt ends it at once
rather than when the wait's deadline (60 s here) passes; nothing is left corrupt
(``fastload cache verify`` is clean afterwards)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload.cache import ShardCache
from fastload.cache.catalog import BUSY_SLICE_S, connect_wal, execute, set_busy_timeout
from fastload.errors import CacheError, CatalogBusy

from .conftest import CountingFetch, blob, key_for

# A liveness bound, far below the waiter's 60 s deadline; the test asserts on how the
# waiter ended.
BOUND_S = 10.0

_WAITER = """
import signal, sys, traceback
from fastload.cache import DiskTier, EntryKey

if {term!r}:
    def on_term(signum, frame):
        traceback.print_stack(frame)
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, on_term)
print("waiting", flush=True)
tier = DiskTier({root!r}, lease_s=60.0, sweep=False)  # constructing it writes nothing
assert tier.catalog.busy_timeout_s == 60.0
tier.get(EntryKey("ds", "new.tar", {checksum!r}), 20000, lambda f: f.write(bytes(20000)))
print("not interrupted", flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _interrupt_a_waiter(cache_dir: Path, holder_code: str, sig: signal.Signals) -> str:
    """Start ``holder_code`` (it takes a lock of the catalog and prints "holding"), stop
    it with SIGSTOP, start a process that constructs a tier on ``cache_dir`` and fetches
    an entry, send it ``sig`` once it waits, and check that it ended by that signal
    within :data:`BOUND_S`; returns its stderr. The holder is killed afterwards."""
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code], stdout=subprocess.PIPE, text=True
    )
    waiter: subprocess.Popen[str] | None = None
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        os.kill(holder.pid, signal.SIGSTOP)
        code = _WAITER.format(
            root=str(cache_dir),
            checksum=key_for(bytes(20000), "new.tar").checksum,
            term=sig == signal.SIGTERM,
        )
        waiter = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        err = _signal_once_blocked(waiter, sig, "the waiter")
        if sig == signal.SIGINT:
            assert waiter.returncode == -signal.SIGINT, err
            assert "KeyboardInterrupt" in err
        else:
            assert waiter.returncode == 143, err
        return err
    finally:
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.wait(30)
        os.kill(holder.pid, signal.SIGKILL)
        os.kill(holder.pid, signal.SIGCONT)
        holder.wait(30)


def _signal_once_blocked(waiter: subprocess.Popen[str], sig: signal.Signals, what: str) -> str:
    """Once ``waiter`` has printed "waiting" and sleeps in its wait, send it ``sig`` and
    check that it ended within :data:`BOUND_S` and never got past the wait ("not
    interrupted" unprinted); returns its stderr."""
    assert waiter.stdout is not None
    assert waiter.stdout.readline() == "waiting\n"
    _wait_until_blocked(waiter.pid)
    os.kill(waiter.pid, sig)
    try:
        out, err = waiter.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        waiter.kill()
        out, err = waiter.communicate()
        raise AssertionError(
            f"{what} did not act on {sig.name} within {BOUND_S} s: {err[-2000:]}"
        ) from None
    assert "not interrupted" not in out
    return err


def _verify_clean(cache_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "cache", "verify", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_ends_a_process_waiting_for_a_stopped_writer(
    cache_dir: Path, sig: signal.Signals
) -> None:
    old = blob(50, 20000)
    first = ShardCache(cache_dir)
    first.open_shard("ds", _Info("old.tar", old), CountingFetch(old)).close()
    first.close()
    holder_code = (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({str(cache_dir / 'catalog.sqlite')!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute('UPDATE meta SET value = value WHERE key = \"clock\"')\n"
        "print('holding', flush=True)\n"
        "time.sleep(600)\n"
    )
    err = _interrupt_a_waiter(cache_dir, holder_code, sig)
    assert "begin_immediate" in err, err  # interrupted while waiting for the write lock
    _verify_clean(cache_dir)
    again = ShardCache(cache_dir)
    with again.open_shard("ds", _Info("old.tar", old), CountingFetch(old)) as s:
        assert bytes(s.data) == old
        assert s.path is not None  # still cached, whole
    again.close()


def test_ctrl_c_ends_a_process_opening_a_catalog_another_one_is_creating(
    cache_dir: Path,
) -> None:
    # the holder is stopped while it creates the catalog (before its switch to WAL: an
    # exclusive lock, which the next process's switch waits for)
    cache_dir.mkdir(parents=True, exist_ok=True)
    catalog = cache_dir / "catalog.sqlite"
    holder_code = (
        "import os, sqlite3, time\n"
        f"os.close(os.open({str(catalog)!r}, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))\n"
        f"c = sqlite3.connect({str(catalog)!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "c.execute('CREATE TABLE half(x)')\n"
        "print('holding', flush=True)\n"
        "time.sleep(600)\n"
    )
    err = _interrupt_a_waiter(cache_dir, holder_code, signal.SIGINT)
    assert "connect_wal" in err, err  # interrupted while opening the catalog
    _verify_clean(cache_dir)
    data = blob(51, 20000)
    cache = ShardCache(cache_dir)
    with cache.open_shard("ds", _Info("s.tar", data), CountingFetch(data)) as s:
        assert bytes(s.data) == data
        assert s.path is not None  # the catalog works: cached
    cache.close()


class _Info:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.bytes = name, len(data)
        self.checksum = key_for(data, name).checksum


def _wait_until_blocked(pid: int) -> None:
    """Wait until ``pid``'s main thread sleeps in ``nanosleep``: past its "waiting"
    line, its code sleeps only while it waits for the catalog's write lock (in sqlite's
    busy handler, or between two tries). Where ``/proc/<pid>/wchan`` names no function
    (a kernel that hides it), wait 5 s instead: the traceback asserted on afterwards
    shows the wait was reached."""
    named = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60.0:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        if "nanosleep" in wchan:
            return
        named = named or not (wchan == "" or wchan.isdigit())
        if not named and time.monotonic() - t0 > 5.0:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never waited for the catalog")


_ITEM_DATASET = """
class Items:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return (i, bytes([i]) * (1000 + i))
"""

_ITEM_WAITER = (
    _ITEM_DATASET
    + """
import sys
from fastload.datasets.cached import cached

ds = cached(Items(), cache_dir={root!r}, key="items-v1", key_file={key_file!r})
assert ds[0] == Items()[0] and ds.stats()["hits"] == 1  # its catalog is open
print("ready", flush=True)
sys.stdin.readline()  # the holder has taken the write lock and is stopped
print("waiting", flush=True)
ds[1]  # made, then its row written: waits for the write lock
print("not interrupted", flush=True)
"""
)


def test_ctrl_c_ends_a_process_writing_an_item_while_a_writer_is_stopped(
    tmp_path: Path,
) -> None:
    # fastload.cached()'s own catalog: a process stopped inside a write there held
    # off Ctrl-C for the whole 60 s wait of a process storing an item
    from fastload.datasets.cached import cached

    ns: dict[str, object] = {}
    exec(_ITEM_DATASET, ns)
    items = ns["Items"]()  # type: ignore[operator]
    key_file = tmp_path / "items.key"
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o600)
    root = tmp_path / "cache"
    ds = cached(items, cache_dir=root, key="items-v1", key_file=key_file)
    assert ds[0] == items[0]  # made and stored: the item catalog exists
    catalog = ds.root / "catalog.sqlite"
    ds.close()

    waiter = subprocess.Popen(
        [sys.executable, "-c", _ITEM_WAITER.format(root=str(root), key_file=str(key_file))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    holder_code = (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({str(catalog)!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute('UPDATE meta SET v = v')\n"
        "print('holding', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder: subprocess.Popen[str] | None = None
    try:
        assert waiter.stdin is not None
        assert waiter.stdout is not None
        assert waiter.stdout.readline() == "ready\n"
        holder = subprocess.Popen(
            [sys.executable, "-c", holder_code], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        os.kill(holder.pid, signal.SIGSTOP)
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        err = _signal_once_blocked(waiter, signal.SIGINT, "the item writer")
        assert waiter.returncode == -signal.SIGINT, err
        assert "KeyboardInterrupt" in err
        assert "_store" in err, err  # interrupted while writing the item's row
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(30)
        if holder is not None:
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)
            holder.wait(30)

    # the holder's write is rolled back; every item is served right, the interrupted
    # one made again
    again = cached(items, cache_dir=root, key="items-v1", key_file=key_file)
    assert [again[i] for i in range(8)] == [items[i] for i in range(8)]
    assert again.stats()["hits"] == 1
    assert again.stats()["misses"] == 7
    assert [again[i] for i in range(8)] == [items[i] for i in range(8)]
    assert again.stats()["hits"] == 9
    assert again.stats()["remade"] == 0
    again.close()


def test_a_sliced_statement_fails_past_its_deadline_naming_the_database(tmp_path: Path) -> None:
    # the item cache's statements (cache.catalog.execute): past the deadline the same
    # CacheError as a catalog write (CatalogBusy), naming the database; any other
    # sqlite failure a CacheError too; once the lock is free, the statement runs
    path = tmp_path / "catalog.sqlite"
    conn = connect_wal(path, busy_timeout_s=60.0)
    conn.execute("CREATE TABLE items (i INTEGER PRIMARY KEY)")
    set_busy_timeout(conn, BUSY_SLICE_S)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO items VALUES (1)")
    where = f"the item cache in {tmp_path}"
    with pytest.raises(CatalogBusy) as busy:
        execute(conn, "INSERT INTO items VALUES (2)", timeout_s=0.3, where=where)
    assert str(busy.value).startswith(f"{where} is unavailable: database is locked")
    assert "stayed locked for 0.3 s" in str(busy.value)
    with pytest.raises(CacheError, match="no such table: missing") as other:
        execute(conn, "SELECT * FROM missing", timeout_s=0.3, where=where)
    assert not isinstance(other.value, CatalogBusy)
    assert str(other.value).startswith(where)
    holder.execute("ROLLBACK")
    execute(conn, "INSERT INTO items VALUES (2)", timeout_s=0.3, where=where)
    assert conn.execute("SELECT i FROM items").fetchall() == [(2,)]
    holder.close()
    conn.close()
