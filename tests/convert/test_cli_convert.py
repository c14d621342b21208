"""``fastload convert``: argument parsing, output on stdout, JSON, errors."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.cli import convert as convert_cli
from fastload.convert import SourceDataError
from fastload.convert.synthetic import make_cityscapes, make_coco, make_folder
from fastload.shards.manifest import Manifest

SRC = Path(__file__).resolve().parents[2] / "src"


def run_cli(argv: list[str]) -> int:
    """Parse and run ``fastload convert ...`` with only this subcommand registered."""
    parser = argparse.ArgumentParser(prog="fastload")
    convert_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_convert_coco_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=6, size=(40, 30))
    out = tmp_path / "out"
    rc = run_cli(
        [
            "convert",
            "coco",
            "--images",
            images,
            "--annotations",
            ann,
            str(out),
            "--shard-size",
            "10KB",
            "--workers",
            "2",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    manifest = Manifest.load(str(out))
    assert doc["version"] == 1
    assert doc["command"] == "convert"
    assert doc["kind"] == "coco"
    assert doc["samples"] == 6 == manifest.num_samples
    assert doc["shards"] == len(manifest.shards) > 1
    assert doc["skipped"] == []


def test_convert_skip_bad_lists_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=5, size=(40, 30))
    victim = sorted(Path(images).iterdir())[1]
    victim.write_bytes(b"garbage")
    argv = ["convert", "coco", "--images", images, "--annotations", ann, str(tmp_path / "o")]
    with pytest.raises(SourceDataError, match=victim.name):
        run_cli(argv)
    assert run_cli([*argv, "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "wrote 4 samples" in out
    assert "skipped 1 bad input(s)" in out
    assert str(victim) in out


def test_convert_cityscapes_and_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_cityscapes(tmp_path / "cs", split="val", per_city=2, size=(32, 16))
    assert (
        run_cli(
            [
                "convert",
                "cityscapes",
                root,
                str(tmp_path / "cso"),
                "--split",
                "val",
                "--mode",
                "fine",
                "--quiet",
            ]
        )
        == 0
    )
    assert Manifest.load(str(tmp_path / "cso")).source["split"] == "val"
    assert "wrote 4 samples" in capsys.readouterr().out
    folder = make_folder(tmp_path / "f", classes=2, per_class=2)
    assert (
        run_cli(
            ["convert", "folder", folder, str(tmp_path / "fo"), "--json", "--storage-options", "{}"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["samples"] == 4


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        run_cli(["convert", "cityscapes", str(tmp_path), str(tmp_path / "o"), "--mode", "x"])
    with pytest.raises(SystemExit):
        run_cli(["convert", "coco", str(tmp_path / "o")])  # --images/--annotations required


def test_convert_imports_without_heavy_dependencies() -> None:
    code = (
        "import sys, fastload.convert, fastload.convert.synthetic, fastload.cli.convert\n"
        "heavy = [m for m in ('torch', 'nvidia.dali', 's3fs', 'PIL') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_the_fastload_command(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    folder = make_folder(tmp_path / "src", classes=2, per_class=2)
    cmd = [sys.executable, "-m", "fastload", "convert", "folder"]
    ok = subprocess.run(
        [*cmd, folder, str(tmp_path / "out"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["samples"] == 4
    bad = subprocess.run(
        [*cmd, str(tmp_path / "nope"), str(tmp_path / "o2")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert f"{tmp_path / 'nope'}: image folder does not exist" in bad.stderr
