"""fastload.CocoDetection returns what torchvision's CocoDetection returns on the originals.

The reference is torchvision's ``__getitem__`` spelled out with pycocotools and Pillow
(``ids = sorted(coco.imgs)``, ``Image.open(root / file_name).convert("RGB")``,
``coco.loadAnns(coco.getAnnIds(id))``), so these tests run where torchvision is absent;
``test_torchvision_dropins.py`` compares with torchvision itself, which imports here
through the test shim.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

import fastload
from fastload import convert
from fastload.convert.synthetic import make_coco, make_folder
from fastload.errors import ConfigError


class ReferenceCocoDetection:
    """torchvision.datasets.CocoDetection, as its source reads."""

    def __init__(self, root: str, ann_file: str) -> None:
        self.root = root
        self.coco = COCO(ann_file)
        self.ids = sorted(self.coco.imgs.keys())

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image_id = self.ids[index]
        path = self.coco.loadImgs(image_id)[0]["file_name"]
        image = Image.open(os.path.join(self.root, path)).convert("RGB")
        return image, self.coco.loadAnns(self.coco.getAnnIds(image_id))


@pytest.fixture(scope="module")
def coco_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    base = tmp_path_factory.mktemp("coco")
    images, ann = make_coco(base / "src", num_images=24, size=(80, 60), seed=11)
    out = str(base / "shards")
    convert.coco(images, ann, out, shard_size="30KB", progress=False)
    return images, ann, out


def assert_same_image(a: Image.Image, b: Image.Image) -> None:
    assert a.mode == b.mode
    assert a.size == b.size
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_every_item_equals_torchvision(coco_data: tuple[str, str, str]) -> None:
    images, ann, out = coco_data
    ref = ReferenceCocoDetection(images, ann)
    ds = fastload.CocoDetection(out)
    assert len(ds) == len(ref) == 24
    assert ds.ids == ref.ids
    assert len(ds.manifest.shards) > 1
    saw_empty = saw_gray = False
    for i in range(len(ref)):
        image, target = ds[i]
        ref_image, ref_target = ref[i]
        assert image.mode == "RGB"
        assert_same_image(image, ref_image)
        assert target == ref_target
        saw_empty |= target == []
        with Image.open(os.path.join(images, ref.coco.imgs[ref.ids[i]]["file_name"])) as raw:
            saw_gray |= raw.mode == "L"
    assert saw_empty
    assert saw_gray


def test_categories(coco_data: tuple[str, str, str]) -> None:
    _, ann, out = coco_data
    ref = COCO(ann)
    ds = fastload.CocoDetection(out)
    assert ds.coco.cats == ref.cats
    assert ds.coco.getCatIds() == ref.getCatIds()
    assert ds.coco.loadCats(ref.getCatIds()[2]) == ref.loadCats(ref.getCatIds()[2])
    assert ds.coco.dataset["licenses"] == ref.dataset["licenses"]


def test_transform_and_target_transform(coco_data: tuple[str, str, str]) -> None:
    _, _, out = coco_data
    plain = fastload.CocoDetection(out)
    ds = fastload.CocoDetection(out, transform=lambda im: im.size, target_transform=len)
    for i in (0, 5):
        image, target = plain[i]
        assert ds[i] == (image.size, len(target))
    only_target = fastload.CocoDetection(out, target_transform=len)
    image, n = only_target[1]
    assert isinstance(image, Image.Image)
    assert n == len(plain[1][1])


def test_joint_transforms(coco_data: tuple[str, str, str]) -> None:
    _, _, out = coco_data
    calls = []

    def joint(image: Image.Image, target: list[dict[str, Any]]) -> tuple[Any, Any]:
        calls.append(1)
        return image.size, [a["id"] for a in target]

    ds = fastload.CocoDetection(out, transforms=joint)
    image, target = fastload.CocoDetection(out)[3]
    assert ds[3] == (image.size, [a["id"] for a in target])
    assert calls == [1]
    with pytest.raises(ValueError, match="Only transforms or transform/target_transform"):
        fastload.CocoDetection(out, transforms=joint, transform=lambda x: x)
    with pytest.raises(ConfigError):
        fastload.CocoDetection(out, transforms=joint, target_transform=len)


def test_torch_dataloader_with_worker_processes(coco_data: tuple[str, str, str]) -> None:
    import torch.utils.data

    _, _, out = coco_data
    ds = fastload.CocoDetection(out, transform=np.asarray)
    loader: Any = torch.utils.data.DataLoader(
        cast(Any, ds), batch_size=5, num_workers=2, collate_fn=list
    )
    got = [item for batch in loader for item in batch]
    assert len(got) == len(ds)
    for i, (image, target) in enumerate(got):
        ref_image, ref_target = ds[i]
        np.testing.assert_array_equal(image, ref_image)
        assert target == ref_target


def test_pickles_for_spawned_workers(coco_data: tuple[str, str, str]) -> None:
    _, _, out = coco_data
    ds = fastload.CocoDetection(out, transform=np.asarray)
    first = ds[0]  # opens a shard: open files must not break pickling
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == len(ds)
    assert clone.ids == ds.ids
    np.testing.assert_array_equal(clone[0][0], first[0])
    assert clone[0][1] == first[1]


def test_refuses_a_dataset_that_is_not_coco(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "src", classes=2, per_class=1)
    convert.folder(root, str(tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match="not a COCO dataset"):
        fastload.CocoDetection(str(tmp_path / "out"))


def test_through_the_disk_cache(coco_data: tuple[str, str, str], tmp_path: Path) -> None:
    images, ann, out = coco_data
    ref = ReferenceCocoDetection(images, ann)
    ds = fastload.CocoDetection(out, cache_dir=tmp_path / "cache", cache_limit="10MB")
    for i in (0, len(ds) // 2, len(ds) - 1):
        image, target = ds[i]
        ref_image, ref_target = ref[i]
        assert_same_image(image, ref_image)
        assert target == ref_target
    assert any((tmp_path / "cache").rglob("*")), "the disk tier was not used"


def test_from_object_storage(seaweed: Any, s3_url: str, tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=10, size=(48, 32), seed=12)
    opts = seaweed.storage_options
    report = convert.coco(
        images, ann, s3_url, shard_size="8KB", storage_options=opts, progress=False
    )
    assert len(report.manifest.shards) > 1
    ref = ReferenceCocoDetection(images, ann)
    ds = fastload.CocoDetection(s3_url, cache_dir=tmp_path / "cache", storage_options=opts)
    assert len(ds) == len(ref) == 10
    assert ds.ids == ref.ids
    for i in range(len(ds)):
        image, target = ds[i]
        ref_image, ref_target = ref[i]
        assert_same_image(image, ref_image)
        assert target == ref_target


def test_coco_is_a_pycocotools_coco(coco_data: tuple[str, str, str]) -> None:
    _, ann, out = coco_data
    ref = COCO(ann)
    ds = fastload.CocoDetection(out)
    coco = ds.coco
    assert isinstance(coco, COCO)
    assert coco is ds.coco  # built once
    assert sorted(coco.imgs) == sorted(ref.imgs) == ds.ids
    assert coco.imgs == ref.imgs
    assert coco.anns == ref.anns
    assert coco.cats == ref.cats
    assert coco.getCatIds() == ref.getCatIds()
    for image_id in ds.ids[:5]:
        assert coco.getAnnIds(imgIds=image_id) == ref.getAnnIds(imgIds=image_id)
    assert ds.categories.getCatIds() == ref.getCatIds()
    clone = pickle.loads(pickle.dumps(ds))  # the index is not pickled, it is rebuilt
    assert clone._coco_box == [None]  # not pickled: rebuilt on demand
    assert clone.coco.anns == ref.anns


def test_cocoeval_with_the_ground_truth_as_detections_gives_ap_one(
    coco_data: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from pycocotools.cocoeval import COCOeval

    _, _, out = coco_data
    gt = fastload.CocoDetection(out).coco
    detections = [
        {
            "image_id": a["image_id"],
            "category_id": a["category_id"],
            "bbox": a["bbox"],
            "score": 1.0,
        }
        for a in gt.loadAnns(gt.getAnnIds())
        if not a.get("iscrowd", 0)
    ]
    assert len(detections) > 10
    evaluator = COCOeval(gt, gt.loadRes(detections), iouType="bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    capsys.readouterr()
    assert evaluator.stats[0] == pytest.approx(1.0)  # AP @ IoU 0.50:0.95, all areas
    assert evaluator.stats[1] == pytest.approx(1.0)  # AP @ IoU 0.50
    # and a wrong detection set is not scored 1.0: the check can fail
    shifted = [dict(d, bbox=[d["bbox"][0] + d["bbox"][2], *d["bbox"][1:]]) for d in detections]
    bad = COCOeval(gt, gt.loadRes(shifted), iouType="bbox")
    bad.evaluate()
    bad.accumulate()
    bad.summarize()
    capsys.readouterr()
    assert bad.stats[0] < 0.5


def test_a_dataset_without_the_files_order_keeps_the_samples_order() -> None:
    # datasets converted before the converter recorded "order": images in sample
    # order (ascending id), each one's annotations after it, as before
    from fastload.datasets.coco import build_coco

    docs = [
        {
            "image": {"id": 2},
            "annotations": [
                {"id": 9, "image_id": 2, "category_id": 1},
                {"id": 4, "image_id": 2, "category_id": 1},
            ],
        },
        {"image": {"id": 5}, "annotations": [{"id": 1, "image_id": 5, "category_id": 1}]},
    ]
    coco = build_coco({"categories": []}, docs)
    assert coco.getImgIds() == [2, 5]
    assert coco.getAnnIds() == [9, 4, 1]
    ordered = [
        dict(docs[0], order={"image": 1, "annotations": [0, 2]}),
        dict(docs[1], order={"image": 0, "annotations": [1]}),
    ]
    coco = build_coco({"categories": []}, ordered)
    assert coco.getImgIds() == [5, 2]
    assert coco.getAnnIds() == [9, 1, 4]
    assert coco.getAnnIds(imgIds=2) == [9, 4]
