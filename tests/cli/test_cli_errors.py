"""Every failure of the ``fastload`` command, run as a real process: one line on stderr
naming the object and the cause, the right exit status, and no traceback (unless
``--debug``). A closed stdout ends the command quietly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from fastload.convert.synthetic import make_folder

_PREFIXES = ("AWS_", "COS_", "FASTLOAD_")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}


def fastload(
    *args: str, prelude: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``fastload ARGS`` in a fresh interpreter (``prelude`` runs first) with the
    environment less its AWS_/COS_/FASTLOAD_ variables, plus ``env``."""
    code = f"import sys\n{prelude}\nfrom fastload.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), **(env or {})},
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """Assert the run failed with ``status``, printed nothing on stdout and exactly one
    line on stderr, without a traceback; return that line."""
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_folder(tmp_path_factory.mktemp("cli") / "src", classes=2, per_class=2)


@pytest.fixture(scope="module")
def dataset(images: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    from fastload import convert

    out = str(tmp_path_factory.mktemp("cli") / "ds")
    convert.folder(images, out, progress=False)
    return out


def test_unknown_scheme_lists_the_supported_ones() -> None:
    line = one_error_line(fastload("inspect", "s4://bucket/data"))
    assert line.startswith("fastload inspect: error: s4://bucket/data: unknown URL scheme 's4://'")
    for scheme in ("s3://", "cos://", "file://", "memory://", "gs://"):
        assert scheme in line


def test_missing_s3_backend_names_the_extra() -> None:
    # the backend's package made unimportable, as on a machine without the extra
    hide = "sys.modules['s3fs'] = None"
    line = one_error_line(fastload("inspect", "s3://bucket/data", prelude=hide))
    assert "s3://bucket/data" in line
    assert "needs the 's3fs' package" in line
    assert "pip install 'fastload[s3]'" in line


def test_missing_fsspec_backend_says_what_to_install() -> None:
    line = one_error_line(
        fastload("inspect", "gs://bucket/data", prelude="sys.modules['gcsfs'] = None")
    )
    assert "gs://bucket/data: the gs:// backend is not installed" in line
    assert "gcsfs" in line


def test_malformed_s3_url_is_not_a_local_path(tmp_path: Path) -> None:
    line = one_error_line(fastload("inspect", "s3:/bucket/data"))
    assert "s3:/bucket/data: malformed URL" in line
    assert "s3://bucket/path" in line
    assert "no such object" not in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_refused_connection_is_reported_as_such() -> None:
    url = f"http://127.0.0.1:{_free_port()}/data"
    line = one_error_line(fastload("inspect", url))
    # retried (fsspec's HTTP filesystem calls it FileNotFoundError), then named
    assert f"{url}/manifest.json failed after" in line
    assert "cannot connect" in line.lower()
    assert "no such object" not in line


def test_refused_s3_endpoint_is_reported_as_such() -> None:
    port = _free_port()
    opts = f'{{"endpoint_url": "http://127.0.0.1:{port}"}}'  # credentials not on argv
    creds = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    line = one_error_line(
        fastload("inspect", "s3://bucket/data", "--storage-options", opts, env=creds)
    )
    assert "s3://bucket/data/manifest.json" in line
    assert "could not connect" in line.lower()
    assert f"127.0.0.1:{port}" in line  # the endpoint that refused
    assert "no such object" not in line


def test_missing_dataset_names_the_object(tmp_path: Path) -> None:
    line = one_error_line(fastload("inspect", str(tmp_path / "nothing")))
    assert f"{tmp_path / 'nothing'}/manifest.json: no such object" in line


def test_output_under_a_file_is_not_a_directory(images: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    line = one_error_line(fastload("convert", "folder", images, str(blocker / "out"), "--quiet"))
    assert line.startswith("fastload convert: error: ")
    assert str(blocker / "out") in line
    assert "Not a directory" in line


def _read_only_run(images: str, target: Path) -> subprocess.CompletedProcess[str]:
    """``fastload convert folder`` into ``target``, a directory it may not write: by its
    mode for an ordinary user, by a read-only bind mount in a private mount
    namespace for root (which ignores modes)."""
    target.mkdir()
    args = ["convert", "folder", images, str(target / "out"), "--quiet"]
    if os.geteuid() != 0:
        target.chmod(0o555)
        return fastload(*args)
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode
    ):
        pytest.skip("running as root without user namespaces: no way to make a read-only directory")
    code = "import sys\nfrom fastload.cli import main\nsys.exit(main(sys.argv[1:]))"
    shell = f'mount --bind -o ro "{target}" "{target}" && exec "$0" "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        check=False,
    )


def test_read_only_output(images: str, tmp_path: Path) -> None:
    target = tmp_path / "ro"
    line = one_error_line(_read_only_run(images, target))
    assert str(target / "out") in line
    assert "Read-only file system" in line or "Permission denied" in line
    assert not (target / "out").exists()


def test_usage_error_exits_2() -> None:
    result = fastload("inspect")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "fastload inspect: error: the following arguments are required: URL|PATH"
    )


def test_cos_region_hint_speaks_cli() -> None:
    line = one_error_line(fastload("inspect", "cos://bucket/data"))
    assert "cos://bucket/data: a cos:// URL needs a region" in line
    assert '--storage-options \'{"region": "ap-guangzhou"}\'' in line
    assert "COS_REGION" in line
    assert "}}" not in line


def test_debug_adds_the_traceback() -> None:
    for args in (["--debug", "inspect", "s4://b/x"], ["inspect", "s4://b/x", "--debug"]):
        result = fastload(*args)
        assert result.returncode == 1
        assert "Traceback" in result.stderr
        assert result.stderr.splitlines()[-1].startswith("fastload inspect: error: s4://b/x")


def _with_closed_stdout(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``fastload ARGS`` with stdout a pipe whose reader is already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        code = "import sys\nfrom fastload.cli import main\nsys.exit(main(sys.argv[1:]))"
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=_env(),
            check=False,
        )
    finally:
        os.close(write_end)


def test_closed_stdout_exits_quietly(dataset: str, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    warm = fastload("cache", "warm", dataset, "--cache-dir", cache)
    assert warm.returncode == 0, warm.stderr
    for args in (
        ["inspect", dataset],
        ["inspect", "--json", dataset],
        ["cache", "stats", "--cache-dir", cache],
        ["cache", "verify", "--cache-dir", cache],
    ):
        result = _with_closed_stdout(args)
        assert result.returncode == 141, (args, result.stderr)
        assert result.stderr == "", (args, result.stderr)
