"""Loader test fixtures: every test must leave no worker process or thread behind."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_leftover_workers() -> Iterator[None]:
    threads_before = set(threading.enumerate())
    yield
    gc.collect()  # iterators a test dropped shut their workers down when collected
    deadline = time.monotonic() + 10.0
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    children = multiprocessing.active_children()
    assert not children, f"test left worker processes behind: {children}"
    while time.monotonic() < deadline:
        extra = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
        if not extra:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"test left threads behind: {extra}")
