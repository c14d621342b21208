"""Converting over an existing output never destroys it: refusal without overwrite,
atomic replacement with it, and an output left exactly as it was by a run that fails
on a corrupt image or is interrupted (SIGINT at random instants)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload import convert
from fastload.convert import SourceDataError
from fastload.convert.synthetic import make_coco
from fastload.errors import OutputExistsError
from fastload.shards.manifest import Manifest
from fastload.storage import open_store

from .shard_helpers import read_dataset

SRC = Path(__file__).resolve().parents[2] / "src"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (hidden ones too) with its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def dataset_files(manifest: Manifest) -> set[str]:
    return {"manifest.json"} | {n for s in manifest.shards for n in (s.name, s.index_name)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    base = tmp_path_factory.mktemp("src")
    return {
        "old": make_coco(base / "old", num_images=12, size=(64, 48), seed=3),
        "new": make_coco(base / "new", num_images=40, size=(64, 48), seed=4),
    }


@pytest.fixture
def existing(sources: dict[str, tuple[str, str]], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    convert.coco(*sources["old"], str(out), shard_size="8KB", progress=False, workers=2)
    return out


def test_reconvert_without_overwrite_is_refused(
    sources: dict[str, tuple[str, str]], existing: Path
) -> None:
    before = snapshot(existing)
    with pytest.raises(OutputExistsError, match="--overwrite") as info:
        convert.coco(*sources["new"], str(existing), shard_size="8KB", progress=False)
    assert info.value.url == str(existing)
    assert snapshot(existing) == before


def test_reconvert_with_overwrite_replaces_and_deletes_the_old_generation(
    sources: dict[str, tuple[str, str]], existing: Path
) -> None:
    old = Manifest.load(str(existing))
    report = convert.coco(
        *sources["new"], str(existing), shard_size="8KB", progress=False, overwrite=True
    )
    new, samples = read_dataset(existing)
    assert new == report.manifest
    assert len(samples) == 40
    # fresh names: the live dataset's shards were never written over
    assert not {s.name for s in new.shards} & {s.name for s in old.shards}
    # the old generation is gone, nothing else is left
    assert set(snapshot(existing)) == dataset_files(new)

    # and a third conversion goes back to free names again, still deleting the second
    convert.coco(*sources["old"], str(existing), shard_size="8KB", progress=False, overwrite=True)
    third = Manifest.load(str(existing))
    assert set(snapshot(existing)) == dataset_files(third)
    assert not {s.name for s in third.shards} & {s.name for s in new.shards}


def test_failing_part_way_leaves_the_previous_dataset_byte_identical(
    sources: dict[str, tuple[str, str]], existing: Path, tmp_path: Path
) -> None:
    images, ann = make_coco(tmp_path / "bad", num_images=40, size=(64, 48), seed=4)
    victim = os.path.join(images, sorted(os.listdir(images))[30])
    data = Path(victim).read_bytes()
    Path(victim).write_bytes(data[: len(data) // 2])  # a truncated JPEG late in the run
    before = snapshot(existing)
    with pytest.raises(SourceDataError, match="corrupt image"):
        convert.coco(images, ann, str(existing), shard_size="8KB", progress=False, overwrite=True)
    assert snapshot(existing) == before
    _, samples = read_dataset(existing)
    assert len(samples) == 12


def test_failing_first_conversion_leaves_no_output(tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "bad", num_images=20, size=(64, 48), seed=5)
    victim = os.path.join(images, sorted(os.listdir(images))[15])
    Path(victim).write_bytes(b"garbage" * 20)
    out = tmp_path / "fresh" / "ds"
    with pytest.raises(SourceDataError):
        convert.coco(images, ann, str(out), shard_size="8KB", progress=False)
    assert not out.exists()


def test_failure_on_s3_leaves_the_previous_dataset(
    sources: dict[str, tuple[str, str]], s3_url: str, seaweed: object, tmp_path: Path
) -> None:
    opts = seaweed.storage_options  # type: ignore[attr-defined]
    convert.coco(*sources["old"], s3_url, shard_size="8KB", storage_options=opts, progress=False)
    store = open_store(s3_url, opts)
    before = {n: store.read(n) for n in store.list()}
    images, ann = make_coco(tmp_path / "bad", num_images=40, size=(64, 48), seed=4)
    victim = os.path.join(images, sorted(os.listdir(images))[30])
    Path(victim).write_bytes(b"not a jpeg" * 30)
    with pytest.raises(OutputExistsError):
        convert.coco(images, ann, s3_url, storage_options=opts, progress=False)
    with pytest.raises(SourceDataError):
        convert.coco(
            images, ann, s3_url, shard_size="8KB", storage_options=opts, progress=False,
            overwrite=True,
        )  # fmt: skip
    assert {n: store.read(n) for n in store.list()} == before


def _convert_cmd(images: str, ann: str, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "fastload", "convert", "coco", "--images", images,
        "--annotations", ann, str(out), "--shard-size", "4KB", "--workers", "2",
        "--quiet", "--no-verify", "--overwrite",
    ]  # fmt: skip


def test_sigint_at_random_instants_never_breaks_the_output(
    sources: dict[str, tuple[str, str]], existing: Path
) -> None:
    """SIGINT a real ``fastload convert --overwrite`` process: either the run finished
    and the new dataset is complete and alone, or the output is byte-identical to
    before. Half the interrupts land after the run's first new shard appeared (so
    surely mid-run), half at a random instant of a whole run's duration."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    before = snapshot(existing)
    old_names = set(before)
    cmd = _convert_cmd(*sources["new"], existing)
    rng = random.Random(11)
    outcomes = {"interrupted": 0, "finished": 0}
    for trial in range(8):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if trial % 2 == 0:
            # wait (by content, not time) for the first new file in the output
            while proc.poll() is None and set(os.listdir(existing)) <= old_names:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.05))
        else:
            time.sleep(rng.uniform(0, 1.5))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        now = snapshot(existing)
        if now == before:
            # stopped before its manifest was published: nothing of it is left, not
            # even an empty temporary directory
            assert proc.returncode in (130, -signal.SIGINT), err.decode()
            assert set(os.listdir(existing)) == old_names, (trial, err.decode())
            outcomes["interrupted"] += 1
            continue
        # otherwise it published: the new dataset is complete and alone (an interrupt
        # that arrives after publishing may still end the process with 130 or -2)
        assert proc.returncode in (0, 130, -signal.SIGINT), err.decode()
        outcomes["finished"] += 1
        manifest, samples = read_dataset(existing)
        assert len(samples) == 40
        assert set(now) == dataset_files(manifest), (trial, err.decode())
        # put the old dataset back for the next trial
        for name in now:
            (existing / name).unlink()
        for name, data in before.items():
            (existing / name).write_bytes(data)
    assert outcomes["interrupted"] >= 1, outcomes
