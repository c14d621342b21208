"""``LocalS3``: a SeaweedFS S3 server that starts, serves, and cleans up after itself,
and that fails with its log tail when it cannot start."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from fastload.bench.local_s3 import LocalS3, LocalS3Error, free_ports
from fastload.storage import open_store


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serves_s3_and_cleans_up() -> None:
    with LocalS3(start_timeout_s=60) as s3:
        assert s3.running
        assert s3.endpoint_url.startswith("http://127.0.0.1:")
        assert s3.proc is not None
        pid, workdir = s3.proc.pid, s3.workdir
        url = s3.new_url("x")
        store = open_store(url, s3.storage_options)
        store.write_bytes("a/b.bin", b"payload")
        assert store.read("a/b.bin") == b"payload"
        assert store.list() == ["a/b.bin"]
        assert s3.secret_key not in repr(s3)
        # every listener has its own explicit port, all bound to 127.0.0.1
        cmd = " ".join(s3.command())
        for flag in (
            "-master.port.grpc=",
            "-volume.port.grpc=",
            "-filer.port.grpc=",
            "-s3.port.grpc=",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
        ):
            assert flag in cmd
        sockets = [p for p in s3.grpc_sockets() if p.exists()]
        assert sockets  # weed made its gRPC sockets in /tmp (no flag moves them)
    assert not s3.running
    assert not _alive(pid)
    assert not workdir.exists()
    assert not [p for p in sockets if p.exists()]  # and stop() removed them
    s3.stop()  # twice is fine


def test_generated_keys_differ_between_servers(tmp_path: Path) -> None:
    a, b = LocalS3(tmp_path / "a"), LocalS3(tmp_path / "b")
    assert a.access_key != b.access_key
    assert a.secret_key != b.secret_key
    assert len(set(free_ports(8))) == 8


def test_a_taken_port_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    s3 = LocalS3(tmp_path / "busy", start_timeout_s=30)
    blocked = s3.master_port
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", blocked))  # the master cannot listen there
    blocker.listen(1)
    try:
        s3.start()
        assert s3.running
        assert s3.master_port != blocked
    finally:
        s3.stop()
        blocker.close()


def test_a_server_that_does_not_answer_fails_with_its_log(tmp_path: Path) -> None:
    # a deadline already past: the gateway is never asked (a tiny positive deadline
    # raced a fast start-up, whose first probe could still succeed)
    s3 = LocalS3(tmp_path / "slow", start_timeout_s=0.0)
    with pytest.raises(LocalS3Error, match="did not answer") as err:
        s3.start()
    assert "weed" in str(err.value)
    assert not s3.running
    assert (tmp_path / "slow" / "weed.log").exists()  # kept for whoever reads the error
