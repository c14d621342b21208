"""Attacks on the filesystem outside fastload's directories and on credentials:
predictable temp names, image paths leaving ``images_dir``, secrets on argv or in
nested options or URLs, and terminal escapes in CLI output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import pytest

from fastload import convert
from fastload.cli.common import parse_storage_options
from fastload.config import FetchConfig, RetryConfig
from fastload.convert import SourceDataError
from fastload.errors import ConfigError, FastloadError
from fastload.shards.writer import ShardWriter
from fastload.storage import open_store
from fastload.storage.url import redact_options, redact_url


def _fastload(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastload", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


# ------------------------------------------------------------------ filesystem
def test_file_store_writes_never_follow_a_planted_temp_name(tmp_path: Path) -> None:
    # The attack: a symlink at the temp name the writer used to use
    # ({path}.tmp-{pid}) points at a file outside the output.
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / f"manifest.json.tmp-{os.getpid()}")
    store = open_store(str(out))
    store.write_bytes("manifest.json", b'{"format": "fastload"}')
    with store.open_write("shard.tar") as f:
        f.write(b"tar bytes")
    assert victim.read_text() == "precious"
    assert (out / "manifest.json").read_bytes() == b'{"format": "fastload"}'
    assert (out / "shard.tar").read_bytes() == b"tar bytes"
    assert not (out / "manifest.json").is_symlink()


def _jpeg(color: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("escape", ["../secret.jpg", "sub/../../secret.jpg", "ABSOLUTE"])
def test_coco_file_names_that_leave_images_dir_are_refused(tmp_path: Path, escape: str) -> None:
    images = tmp_path / "images"
    images.mkdir()
    (images / "ok.jpg").write_bytes(_jpeg((1, 2, 3)))
    secret = tmp_path / "secret.jpg"  # an image-shaped private file next to the dataset
    secret.write_bytes(_jpeg((200, 100, 50)))
    name = str(secret) if escape == "ABSOLUTE" else escape
    ann = tmp_path / "instances.json"
    ann.write_text(
        json.dumps(
            {
                "images": [
                    {"id": 1, "file_name": "ok.jpg", "width": 8, "height": 8},
                    {"id": 2, "file_name": name, "width": 8, "height": 8},
                ],
                "annotations": [],
                "categories": [],
            }
        )
    )
    out = tmp_path / "out"
    with pytest.raises(SourceDataError, match="leaves the image directory"):
        convert.coco(images, ann, str(out), progress=False, workers=1)
    report = convert.coco(images, ann, str(out), progress=False, workers=1, on_error="skip")
    assert report.samples == 1
    stored = b"".join(p.read_bytes() for p in out.glob("*.tar"))
    assert secret.read_bytes() not in stored


# ------------------------------------------------------------------ credentials
def test_storage_options_from_a_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = tmp_path / "s3.json"
    opts.write_text(json.dumps({"key": "AKIA", "secret": "FROM-FILE-SECRET"}))
    os.chmod(opts, 0o600)
    assert parse_storage_options(f"@{opts}") == {"key": "AKIA", "secret": "FROM-FILE-SECRET"}
    monkeypatch.setenv("FASTLOAD_STORAGE_OPTIONS", f"@{opts}")
    assert parse_storage_options(None) == {"key": "AKIA", "secret": "FROM-FILE-SECRET"}
    monkeypatch.setenv("FASTLOAD_STORAGE_OPTIONS", '{"region": "eu-west-1"}')
    assert parse_storage_options(None) == {"region": "eu-west-1"}
    assert capsys.readouterr().err == ""  # no warning for the file and the environment
    os.chmod(opts, 0o644)
    parse_storage_options(f"@{opts}")
    assert "chmod 600" in capsys.readouterr().err
    monkeypatch.setenv("FASTLOAD_STORAGE_OPTIONS", '{"secret": "S3CR3T-NOT-JSON')
    with pytest.raises(ConfigError, match="FASTLOAD_STORAGE_OPTIONS is not valid JSON") as info:
        parse_storage_options(None)
    assert "S3CR3T" not in str(info.value)


def test_a_secret_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url) as w:
        w.write({"__key__": "a", "bin": b"x"})
    inline = _fastload("inspect", url, "--storage-options", '{"client_kwargs": {"token": "T0K"}}')
    assert inline.returncode == 0, inline.stderr
    assert "holds a credential" in inline.stderr
    assert "T0K" not in inline.stderr
    opts = tmp_path / "opts.json"
    opts.write_text('{"client_kwargs": {"token": "T0K"}}')
    os.chmod(opts, 0o600)
    from_file = _fastload("inspect", url, "--storage-options", f"@{opts}")
    assert from_file.returncode == 0, from_file.stderr
    assert "warning" not in from_file.stderr
    from_env = _fastload("inspect", url, env={"FASTLOAD_STORAGE_OPTIONS": f"@{opts}"})
    assert from_env.returncode == 0, from_env.stderr
    assert "warning" not in from_env.stderr


def test_credentials_nested_anywhere_are_redacted() -> None:
    options = {
        "key": "AKIAEXAMPLE",
        "client_kwargs": {
            "aws_secret_access_key": "NESTED-SECRET",
            "endpoint_url": "https://user:URL-PASSWORD@s3.internal:9000",
        },
        "config_kwargs": {"signature_version": "s3v4", "headers": [{"X-Auth-Token": "HDR"}]},
    }
    shown = json.dumps(redact_options(options))
    for secret in ("AKIAEXAMPLE", "NESTED-SECRET", "URL-PASSWORD", "HDR"):
        assert secret not in shown
    assert "s3v4" in shown and "s3.internal" in shown  # noqa: PT018 - kept, not redacted
    assert (
        redact_url("https://h/o?X-Amz-Signature=abc&part=1")
        == "https://h/o?X-Amz-Signature=***&part=1"
    )
    store = open_store("memory://bucket/x", {"client_kwargs": {"sas_token": "NESTED-SAS"}})
    assert store._redact("backend said NESTED-SAS is bad") == "backend said *** is bad"


@pytest.mark.s3
def test_a_password_in_the_endpoint_url_never_reaches_a_message() -> None:
    fetch = FetchConfig(retry=RetryConfig(max_attempts=1, timeout_s=2, deadline_s=5))
    store = open_store(
        "s3://bucket/data",
        {
            "key": "AKIAEXAMPLE",
            "secret": "TOP-SECRET",
            "client_kwargs": {"endpoint_url": "http://admin:ENDPOINT-PW@127.0.0.1:9"},
        },
        fetch=fetch,
    )
    with pytest.raises(FastloadError) as info:
        store.read("manifest.json")
    assert "ENDPOINT-PW" not in str(info.value)
    assert "TOP-SECRET" not in str(info.value)
    assert "ENDPOINT-PW" not in repr(store)


def test_credentials_inside_an_s3_url_are_refused_without_echoing_them() -> None:
    with pytest.raises(ConfigError, match="credentials in the URL") as info:
        open_store("s3://AKIAEXAMPLE:URL-SECRET@bucket/data")
    assert "URL-SECRET" not in str(info.value)


# --------------------------------------------------------------- terminal escapes
ESCAPES = "\x1b]0;owned\x07\x1b[2J\r\u202e"


def test_inspect_escapes_control_characters_from_the_manifest(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url, source={"kind": "folder", f"note{ESCAPES}": f"hi{ESCAPES}"}) as w:
        w.write({"__key__": "a", "bin": b"x"})
    out = _fastload("inspect", url)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\u202e" not in out.stdout  # noqa: PT018
    assert "\\x1b]0;owned" in out.stdout


def test_cache_stats_escapes_control_characters_from_the_catalog(tmp_path: Path) -> None:
    from fastload.cache import DiskTier, EntryKey
    from fastload.shards.checksum import xxh3_128

    data = b"shard bytes"
    tier = DiskTier(tmp_path / "cache")
    key = EntryKey(f"s3://evil{ESCAPES}/ds", "shard.tar", xxh3_128(data))

    def fetch(f: BinaryIO) -> None:
        f.write(data)

    tier.get(key, len(data), fetch)
    tier.catalog.close()
    out = _fastload("cache", "stats", "--cache-dir", str(tmp_path / "cache"))
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\u202e" not in out.stdout  # noqa: PT018
    assert "evil\\x1b" in out.stdout


def test_cli_errors_escape_control_characters_from_the_data(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    ann = tmp_path / "instances.json"
    doc = {"images": [{"id": 1, "file_name": f"x{ESCAPES}.jpg"}], "annotations": []}
    ann.write_text(json.dumps({**doc, "categories": []}))
    out = _fastload(
        "convert", "coco", "--images", str(images), "--annotations", str(ann), "--quiet",
        str(tmp_path / "out"),
    )  # fmt: skip
    assert out.returncode == 1
    assert "image file is missing" in out.stderr
    assert "\x1b" not in out.stderr and "\u202e" not in out.stderr  # noqa: PT018
    assert "x\\x1b]0;owned" in out.stderr
