"""Socket chores of the test servers and proxies (``support.faultproxy``,
``bench.throttle``, the TLS relay of ``storage/test_direct.py``): the accept loop that
stops when asked, and closing every connection still open."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator


def accepted(listener: socket.socket, stop: threading.Event) -> Iterator[socket.socket]:
    """Each connection ``listener`` accepts, until ``stop`` is set or the listener is
    closed. ``listener`` needs a timeout (``settimeout``) so that ``stop`` is seen."""
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        yield conn


def close_all(socks: Iterable[socket.socket]) -> None:
    """Shut down (which wakes a thread blocked in ``recv``) and close each socket; one
    already closed is passed over."""
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
