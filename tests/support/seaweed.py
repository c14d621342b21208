"""A real SeaweedFS server (master, volume, filer, S3 gateway) on 127.0.0.1 for tests.

:class:`SeaweedServer` is :class:`fastload.bench.local_s3.LocalS3` (the launcher
``fastload demo`` uses: explicit free ports for every HTTP and gRPC listener,
telemetry off, an S3 identity file, a readiness probe with a deadline and the log
tail on failure, retry on fresh ports when one was taken) with fixed test
credentials. Benchmarks import this module by path.
"""

from __future__ import annotations

import os

from fastload.bench.local_s3 import LocalS3, find_weed, free_port

__all__ = ["ACCESS_KEY", "SECRET_KEY", "SeaweedServer", "find_weed", "free_port"]

ACCESS_KEY = "fastloadtestkey"
SECRET_KEY = "fastload-test-secret-0123456789"


class SeaweedServer(LocalS3):
    """A LocalS3 with the test suite's fixed credentials (so a failing test's log and
    its commands can be reproduced by hand)."""

    def __init__(
        self, workdir: str | os.PathLike[str] | None = None, start_timeout_s: float = 60.0
    ) -> None:
        super().__init__(
            workdir, access_key=ACCESS_KEY, secret_key=SECRET_KEY, start_timeout_s=start_timeout_s
        )
