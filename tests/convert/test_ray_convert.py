"""Conversion on Ray (``executor="ray"`` / ``fastload convert --ray``) on a local Ray
runtime with 2 CPUs: the same samples as the local converter, byte for byte and in
order; one merged manifest; a failure leaves the output as it was.

Every Ray call runs in one child interpreter for the module (``ray_child``), which
starts the Ray runtime once: an abort of Ray's core worker (seen in CI:
``task_manager.cc ... An unexpected system state has occurred``) then fails the test
that was running, with the child's exit code and output tail, and the next test
starts a new child, instead of killing the pytest process. The local conversions and
every assertion stay in the test process."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload import convert
from fastload.convert import SourceDataError
from fastload.convert.synthetic import make_cityscapes, make_coco, make_folder
from fastload.errors import ConfigError
from support.child import ChildInterpreter

from . import ray_helpers
from .shard_helpers import read_dataset
from .test_safe_convert import dataset_files, snapshot

if importlib.util.find_spec("ray") is None:  # not imported here: Ray runs in the child
    pytest.skip("could not import 'ray'", allow_module_level=True)

pytestmark = pytest.mark.slow  # starting the Ray runtime takes several seconds


@pytest.fixture(scope="module")
def ray_child() -> Iterator[ChildInterpreter]:
    """The child interpreter that drives Ray (started, with the runtime, on first use)."""
    with ChildInterpreter(
        "ray driver", on_start=ray_helpers.start_ray, on_close=ray_helpers.stop_ray
    ) as child:
        yield child


def test_coco_on_ray_equals_local(tmp_path: Path, ray_child: ChildInterpreter) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=40, size=(64, 48), seed=8)
    local = convert.coco(images, ann, str(tmp_path / "local"), shard_size="8KB", progress=False)
    remote = ray_child.call(
        convert.coco,
        images, ann, str(tmp_path / "ray"), shard_size="8KB", progress=False, executor="ray",
    )  # fmt: skip
    m_local, s_local = read_dataset(tmp_path / "local")
    m_ray, s_ray = read_dataset(tmp_path / "ray")
    assert s_ray == s_local
    assert len(s_ray) == 40
    assert m_ray.source == m_local.source
    assert m_ray.fields == m_local.fields
    assert remote.manifest == m_ray
    assert local.samples == remote.samples
    # several parts, each its own names; nothing else in the output
    assert len({s.name.rsplit("-", 1)[0] for s in m_ray.shards}) > 1
    assert set(snapshot(tmp_path / "ray")) == dataset_files(m_ray)


def test_folder_and_cityscapes_on_ray_equal_local(
    tmp_path: Path, ray_child: ChildInterpreter
) -> None:
    root = make_folder(tmp_path / "folder", classes=3, per_class=5, size=(24, 24))
    cs = make_cityscapes(tmp_path / "cs", cities=2, per_city=3, size=(32, 16))
    for name, fn, src in (("folder", convert.folder, root), ("cs", convert.cityscapes, cs)):
        fn(src, str(tmp_path / f"{name}-local"), shard_size="4KB", progress=False)
        ray_child.call(
            fn, src, str(tmp_path / f"{name}-ray"), shard_size="4KB", progress=False,
            executor="ray",
        )  # fmt: skip
        m_local, s_local = read_dataset(tmp_path / f"{name}-local")
        m_ray, s_ray = read_dataset(tmp_path / f"{name}-ray")
        assert s_ray == s_local, name
        assert m_ray.source == m_local.source, name


def test_failure_on_ray_leaves_the_previous_dataset(
    tmp_path: Path, ray_child: ChildInterpreter
) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=30, size=(64, 48), seed=9)
    out = tmp_path / "out"
    convert.coco(images, ann, str(out), shard_size="8KB", progress=False)
    before = snapshot(out)
    listed = sorted(os.listdir(out))
    victim = os.path.join(images, sorted(os.listdir(images))[25])
    Path(victim).write_bytes(b"not a jpeg" * 40)
    with pytest.raises(SourceDataError, match="not an image") as info:
        ray_child.call(
            convert.coco,
            images, ann, str(out), shard_size="8KB", progress=False, overwrite=True,
            executor="ray",
        )  # fmt: skip
    assert info.value.path == victim
    assert snapshot(out) == before
    assert sorted(os.listdir(out)) == listed  # no temporary directory left either
    # with skip, the bad image is reported and the rest replaces the old dataset
    report = ray_child.call(
        convert.coco,
        images, ann, str(out), shard_size="8KB", progress=False, overwrite=True,
        executor="ray", on_error="skip",
    )  # fmt: skip
    assert [s.path for s in report.skipped] == [victim]
    manifest, samples = read_dataset(out)
    assert len(samples) == 29
    assert manifest.source["skipped"] == 1
    assert set(snapshot(out)) == dataset_files(manifest)


def test_cli_ray_flag_and_bad_executor(tmp_path: Path, ray_child: ChildInterpreter) -> None:
    root = make_folder(tmp_path / "folder", classes=2, per_class=3, size=(16, 16))
    argv = ["convert", "folder", root, str(tmp_path / "o"), "--ray", "--quiet"]
    assert ray_child.call(ray_helpers.run_cli, argv) == 0
    _, samples = read_dataset(tmp_path / "o")
    assert len(samples) == 6
    with pytest.raises(ConfigError, match="executor"):
        convert.folder(root, str(tmp_path / "x"), executor="spark")
