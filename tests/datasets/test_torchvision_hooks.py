"""The drop-ins as torchvision's own classes: ``isinstance``, the hooks a subclass
overrides (``_load_image``, ``_load_target``), torchvision's attributes, the call shape
torchvision's reference recipes use, the cache transport's interface (``source``,
``build_item``, ``batch_transport``), I/O counters, pickling, and the plain classes
left where torchvision does not import.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO

import fastload
from fastload import convert
from fastload.convert.synthetic import make_cityscapes, make_coco, make_folder

tv = pytest.importorskip("torchvision", reason="torchvision is not installed")
from torchvision import datasets as tvd  # noqa: E402
from torchvision.datasets.vision import StandardTransform  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("tv_hooks")
    images, ann = make_coco(base / "coco", num_images=12, size=(56, 40), seed=4)
    convert.coco(images, ann, str(base / "coco_out"), shard_size="12KB", progress=False)
    cs = make_cityscapes(base / "cs", split="val", cities=2, per_city=2, size=(48, 24), seed=2)
    convert.cityscapes(cs, str(base / "cs_out"), split="val", progress=False)
    folder = make_folder(base / "folder", classes=3, per_class=3, seed=5, size=(32, 24))
    convert.folder(folder, str(base / "folder_out"), shard_size="8KB", progress=False)
    return {
        "images": images,
        "ann": ann,
        "coco": str(base / "coco_out"),
        "cs_root": cs,
        "cs": str(base / "cs_out"),
        "folder_root": folder,
        "folder": str(base / "folder_out"),
    }


def _drop_ins(data: dict[str, Any], **transforms: Any) -> list[Any]:
    return [
        fastload.CocoDetection(data["coco"], **transforms),
        fastload.Cityscapes(data["cs"], split="val", target_type=["semantic", "polygon"],
                            **transforms),
        fastload.ImageFolder(data["folder"], **transforms),
    ]  # fmt: skip


def arrays(target: Any) -> Any:
    """A target with its images as arrays (a target_transform that keeps everything)."""
    if isinstance(target, Image.Image):
        return np.asarray(target)
    if isinstance(target, tuple):
        return tuple(arrays(t) for t in target)
    return target


def same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(b, Image.Image):
        assert (a.mode, a.size) == (b.mode, b.size)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif isinstance(b, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


# -------------------------------------------------------- torchvision's classes
def test_the_drop_ins_are_torchvision_datasets(data: dict[str, Any]) -> None:
    coco, cs, folder = _drop_ins(data)
    for ds, base in ((coco, tvd.CocoDetection), (cs, tvd.Cityscapes), (folder, tvd.ImageFolder)):
        assert isinstance(ds, base)
        assert isinstance(ds, tvd.VisionDataset)
        assert isinstance(ds, torch.utils.data.Dataset)
        assert ds.root == ds.url
    ref_coco = tvd.CocoDetection(data["images"], data["ann"])
    assert coco.ids == ref_coco.ids
    assert [tuple(c) for c in cs.classes] == [tuple(c) for c in tvd.Cityscapes.classes]
    ref = tvd.ImageFolder(data["folder_root"])
    assert folder.classes == ref.classes
    assert folder.class_to_idx == ref.class_to_idx
    assert folder.targets == ref.targets
    assert [t for _, t in folder.samples] == [t for _, t in ref.samples]
    assert folder.imgs == folder.samples


def test_transforms_is_a_standard_transform(data: dict[str, Any]) -> None:
    for ds in _drop_ins(data, transform=np.asarray, target_transform=str):
        assert isinstance(ds.transforms, StandardTransform)
        assert ds.transform is np.asarray
        assert ds.target_transform is str
        image, target = ds[1]
        assert isinstance(image, np.ndarray)
        assert isinstance(target, str)
    for ds in _drop_ins(data):
        assert ds.transforms is None


def test_adding_drop_ins_concatenates(data: dict[str, Any]) -> None:
    coco, _, folder = _drop_ins(data)
    both = coco + folder
    assert isinstance(both, torch.utils.data.ConcatDataset)
    assert len(both) == len(coco) + len(folder)
    same(both[len(coco)], folder[0])
    same(both[3], coco[3])


# ----------------------------------------------------------------- the hooks
class GrayCrowdless(fastload.CocoDetection):
    """A common customisation: grey images, crowd annotations left out."""

    def _load_image(self, id: int) -> Any:
        return super()._load_image(id).convert("L")

    def _load_target(self, id: int) -> list[Any]:
        return [a for a in super()._load_target(id) if not a["iscrowd"]]


class RefGrayCrowdless(tvd.CocoDetection):
    def _load_image(self, id: int) -> Any:
        return super()._load_image(id).convert("L")

    def _load_target(self, id: int) -> list[Any]:
        return [a for a in super()._load_target(id) if not a["iscrowd"]]


def test_overridden_hooks_take_effect(data: dict[str, Any]) -> None:
    ds = GrayCrowdless(data["coco"])
    ref = RefGrayCrowdless(data["images"], data["ann"])
    plain = fastload.CocoDetection(data["coco"])
    dropped = 0
    for i in range(len(ref)):
        same(ds[i], ref[i])
        assert ds[i][0].mode == "L"
        same(ds.build_item(ds.source.read(i)), ds[i])
        dropped += len(plain[i][1]) - len(ds[i][1])
    assert dropped > 0  # the crowd annotations were there, and left out
    assert ds.batch_transport  # build_item calls the hooks
    same(pickle.loads(pickle.dumps(ds))[2], ds[2])


class RecipeCocoDetection(fastload.CocoDetection):
    """torchvision's references/detection/coco_utils.py CocoDetection, base swapped."""

    def __init__(self, img_folder: str, ann_file: str, transforms: Any) -> None:
        super().__init__(img_folder, ann_file)  # type: ignore[arg-type]
        self._transforms = transforms


class KeyedCocoDetection(fastload.CocoDetection):
    """The same recipe, written for fastload: its own __getitem__."""

    def __getitem__(self, idx: int) -> tuple[Any, Any]:
        img, target = super().__getitem__(idx)
        return img, {"image_id": self.ids[idx], "annotations": target}


def test_torchvisions_call_shape_is_refused_at_construction(data: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"transform must be a callable.*annFile"):
        RecipeCocoDetection(data["coco"], data["ann"], None)
    with pytest.raises(TypeError, match="target_transform must be a callable"):
        fastload.CocoDetection(data["coco"], None, Path(data["ann"]))
    with pytest.raises(TypeError, match="transform must be a callable"):
        fastload.ImageFolder(data["folder"], data["folder_root"])
    with pytest.raises(TypeError, match="transforms must be a callable"):
        fastload.Cityscapes(data["cs"], "val", "fine", "semantic", None, None, 3)  # type: ignore[arg-type]
    keyed = KeyedCocoDetection(data["coco"])
    assert keyed[0][1]["image_id"] == keyed.ids[0]
    assert not keyed.batch_transport  # its items are not build_item's


def test_coco_lists_images_and_annotations_in_the_files_order(data: dict[str, Any]) -> None:
    ref = COCO(data["ann"])
    coco = fastload.CocoDetection(data["coco"]).coco
    assert coco.getImgIds() == ref.getImgIds() != sorted(ref.getImgIds())  # shuffled file
    assert coco.getAnnIds() == ref.getAnnIds()
    assert coco.dataset["images"] == ref.dataset["images"]
    assert coco.dataset["annotations"] == ref.dataset["annotations"]
    for image_id in ref.getImgIds():
        assert coco.getAnnIds(imgIds=image_id) == ref.getAnnIds(imgIds=image_id)


# ------------------------------------------------ the cache transport's interface
@pytest.mark.parametrize("views", [False, True], ids=["bytes", "memoryviews"])
def test_build_item_of_each_raw_sample_is_the_item(data: dict[str, Any], views: bool) -> None:
    for ds in _drop_ins(data, transform=np.asarray, target_transform=arrays):
        assert ds.batch_transport is True
        assert isinstance(ds.source, fastload.datasets.source.ShardSource)
        for i in range(len(ds)):
            sample = ds.source.read(i)
            if views:  # as the loader's process reads them from its mapping of the cache
                sample = {k: v if k == "__key__" else memoryview(v) for k, v in sample.items()}
            same(ds.build_item(sample), ds[i])


def test_the_drop_ins_report_io(data: dict[str, Any], tmp_path: Path) -> None:
    coco, cs, folder = _drop_ins(data)
    for ds in (coco, cs, folder):
        assert ds.io_stats()["ram_bytes"] == 0
        ds[0]
        io = ds.io_stats()
        assert io["ram_bytes"] > 0
        assert io["cache_misses"] >= 1
    ds = fastload.ImageFolder(data["folder"], cache_dir=tmp_path / "cache")
    loader = fastload.DataLoader(ds, batch_size=4, transport="pickle", collate_fn=list)
    got = [item for batch in loader for item in batch]
    for i, item in enumerate(got):
        same(item, ds[i])
    stats = loader.stats()
    assert stats.io["disk_bytes"] > 0
    assert stats.cache_hit_ratio is not None
    loader.close()


def test_the_drop_ins_pickle(data: dict[str, Any]) -> None:
    for ds in _drop_ins(data, transform=np.asarray):
        first = ds[0]
        clone = pickle.loads(pickle.dumps(ds))
        assert type(clone) is type(ds)
        same(clone[0], first)
        same(clone[len(ds) - 1], ds[len(ds) - 1])


# ------------------------------------------------------- without torchvision
_CHILD = """
import json, sys
{prelude}
import fastload
assert "torchvision" not in sys.modules or {absent}  # import fastload imports no torchvision
coco = fastload.CocoDetection({coco!r}, target_transform=len)
folder = fastload.ImageFolder({folder!r})
image, n = coco[0]
from fastload.datasets import vision
try:
    import torchvision
    error = None
except Exception as exc:
    error = type(exc).__name__
print(json.dumps({{
    "torchvision": vision.TORCHVISION, "error": error, "n": len(coco),
    "image": list(image.size), "annotations": n, "target": folder[4][1],
    "bases": [c.__name__ for c in type(coco).__mro__],
    "transforms": type(coco.transforms).__name__, "sum": len(coco + folder),
}}))
"""


@pytest.mark.parametrize("how", ["absent", "broken"])
def test_without_torchvision_the_drop_ins_are_plain_datasets(
    data: dict[str, Any], how: str
) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")  # no test shim: the registry's wheel as it is
    prelude = "sys.modules['torchvision'] = None" if how == "absent" else ""
    code = _CHILD.format(
        prelude=prelude, absent=how == "absent", coco=data["coco"], folder=data["folder"]
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if how == "broken" and out["error"] is None:
        pytest.skip("torchvision's wheel loads beside this torch: nothing is broken here")
    assert out["torchvision"] is False
    assert out["error"] == ("ModuleNotFoundError" if how == "absent" else "RuntimeError")
    assert "VisionDataset" not in out["bases"]
    assert out["bases"][:4] == ["CocoDetection", "BuiltItems", "SourceBacked", "PlainVisionDataset"]
    assert out["n"] == 12
    image, target = fastload.CocoDetection(data["coco"])[0]
    assert out["image"] == list(image.size)
    assert out["annotations"] == len(target)
    assert out["target"] == fastload.ImageFolder(data["folder"])[4][1]
    assert out["transforms"] == "PairTransform"
    assert out["sum"] == 12 + 9


def test_import_fastload_imports_no_torchvision() -> None:
    code = (
        "import sys, fastload\n"
        "fastload.ShardedDataset, fastload.convert, fastload.DataLoader\n"
        "print('torchvision' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert r.stdout.strip() == "False"
