"""A guard that fails a test which leaves threads behind (style habit 10)."""

from __future__ import annotations

import threading
import time

__all__ = ["IGNORED_THREAD_PREFIXES", "leaked_threads"]

# Long-lived by design: fsspec's one event-loop thread, asyncio's default executor,
# and tqdm's monitor thread (started once per process, even for disabled bars).
IGNORED_THREAD_PREFIXES = ("fsspecIO", "asyncio_", "pytest_timeout", "tqdm_monitor")


def leaked_threads(before: set[threading.Thread], grace_s: float = 5.0) -> list[str]:
    """Names of threads alive now that were not in ``before`` (after up to ``grace_s``
    seconds for them to finish), ignoring :data:`IGNORED_THREAD_PREFIXES`."""
    deadline = time.monotonic() + grace_s
    while True:
        new = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.name.startswith(IGNORED_THREAD_PREFIXES)
        ]
        if not new or time.monotonic() >= deadline:
            return sorted(t.name for t in new)
        new[0].join(timeout=0.1)
