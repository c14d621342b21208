"""torchvision's detection recipe (``references/detection``, Mask R-CNN on COCO) with
``fastload.CocoDetection`` in place of ``torchvision.datasets.CocoDetection``: the
same training steps give the same losses, value for value, and the reference's
evaluator takes the dataset's own ``coco`` object.

The data: COCO-style images with polygons, a crowd RLE and an image without
annotations, converted to shards on SeaweedFS; torchvision's dataset reads the
original files. Both go through ``wrap_dataset_for_transforms_v2`` and the reference's
``transforms.v2`` training preset (the flip with ``p=1``, so worker seeding, which
differs between the loaders, cannot change an item), a ``GroupedBatchSampler`` over a
seeded ``RandomSampler`` with the reference's aspect-ratio groups, the reference's
``collate_fn`` and 2 workers: fastload's through ``fastload.DataLoader``,
torchvision's through torch's.
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

import pytest
import torch

import fastload
from fastload import convert
from fastload.convert.synthetic import make_coco

tv = pytest.importorskip("torchvision", reason="torchvision is not installed")
from pycocotools.cocoeval import COCOeval  # noqa: E402
from torchvision import datasets as tvd  # noqa: E402
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap_v2  # noqa: E402
from torchvision.models.detection import maskrcnn_resnet50_fpn  # noqa: E402

from loader.reference_samplers import GroupedBatchSampler  # noqa: E402

from .detection_reference import (  # noqa: E402
    RebuildRefused,
    aspect_ratio_groups,
    coco_api_from_dataset,
    collate_fn,
    remove_images_without_annotations,
    train_transforms,
)

KEYS = ["boxes", "labels", "image_id", "masks"]  # get_coco(..., use_v2=True, with_masks=True)
STEPS = 2
BATCH = 2


@pytest.fixture(scope="module")
def coco_s3(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str, Any]:
    base = tmp_path_factory.mktemp("recipe_coco")
    images, ann = make_coco(base / "src", num_images=12, size=(48, 32), seed=21)
    url = seaweed.new_url("recipe_coco")
    opts = seaweed.storage_options
    convert.coco(images, ann, url, shard_size="16KB", storage_options=opts, progress=False)
    return images, ann, url, opts


def _datasets(coco_s3: tuple[str, str, str, Any]) -> tuple[Any, Any]:
    images, ann, url, opts = coco_s3
    t = train_transforms(hflip_prob=1.0)
    ours = fastload.CocoDetection(url, transforms=t, storage_options=opts)  # the one line
    theirs = tvd.CocoDetection(images, ann, transforms=t)
    return wrap_v2(ours, target_keys=KEYS), wrap_v2(theirs, target_keys=KEYS)


def _train_sets(coco_s3: tuple[str, str, str, Any]) -> tuple[Any, Any]:
    """``get_coco(..., "train", use_v2=True, with_masks=True)``: wrapped, then the
    images without a usable annotation left out."""
    ours, theirs = _datasets(coco_s3)
    return remove_images_without_annotations(ours), remove_images_without_annotations(theirs)


def _batch_sampler(ds: Any) -> GroupedBatchSampler:
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(3))
    return GroupedBatchSampler(sampler, aspect_ratio_groups(ds, k=3), BATCH)


def _reference_loader(ds: Any, num_workers: int) -> Any:
    return torch.utils.data.DataLoader(
        ds, batch_sampler=_batch_sampler(ds), num_workers=num_workers, collate_fn=collate_fn
    )


def _train(model: Any, loader: Any) -> tuple[list[dict[str, float]], list[list[int]]]:
    """``train_one_epoch``'s inner loop for ``STEPS`` batches: the losses and the
    image ids of each batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    losses, ids = [], []
    it = iter(loader)
    torch.manual_seed(0)  # after the loader drew its worker seeds
    for _ in range(STEPS):
        images, targets = next(it)
        loss_dict = model(list(images), list(targets))
        loss = sum(loss_dict.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append({k: v.item() for k, v in loss_dict.items()})
        ids.append([int(t["image_id"]) for t in targets])
    del it
    return losses, ids


@pytest.mark.slow  # three short Mask R-CNN runs: 1-2.5 min on a shared 2-core machine
def test_mask_rcnn_steps_give_torchvisions_losses(coco_s3: tuple[str, str, str, Any]) -> None:
    ours, theirs = _train_sets(coco_s3)
    assert ours.indices == theirs.indices
    assert len(ours) < len(ours.dataset)  # the image without annotations is left out
    groups = aspect_ratio_groups(theirs, k=3)
    assert aspect_ratio_groups(ours, k=3) == groups
    assert len(set(groups)) >= 2  # landscape and portrait images: the grouping matters
    torch.manual_seed(0)
    model = maskrcnn_resnet50_fpn(  # small and few boxes: CPU-light
        weights=None,
        weights_backbone=None,
        num_classes=91,
        min_size=48,
        max_size=72,
        rpn_pre_nms_top_n_train=100,
        rpn_post_nms_top_n_train=50,
        box_batch_size_per_image=32,
    )
    start = copy.deepcopy(model.state_dict())
    # a first run rounds a few losses differently in the last bits (torchvision
    # compiles its Python roi_align, which projects the masks onto the boxes, on first
    # use): the same steps once, unmeasured, so both measured runs start alike
    _train(model, _reference_loader(theirs, num_workers=0))
    model.load_state_dict(start)

    loader = fastload.DataLoader(
        ours, batch_sampler=_batch_sampler(ours), num_workers=2, collate_fn=collate_fn
    )
    got, got_ids = _train(model, loader)
    stats = loader.stats()
    loader.close()

    model.load_state_dict(start)
    want, want_ids = _train(model, _reference_loader(theirs, num_workers=2))

    assert got_ids == want_ids
    assert got == want  # every loss, value for value
    assert all(v > 0 for step in got for v in step.values())
    for batch in got_ids:  # one aspect-ratio group per batch
        ids = [theirs.dataset.ids[i] for i in theirs.indices]
        assert len({groups[ids.index(i)] for i in batch}) == 1
    assert stats.samples >= STEPS * BATCH  # images counted, not tensor channels


def test_the_reference_evaluator_takes_ds_coco(coco_s3: tuple[str, str, str, Any]) -> None:
    ours, theirs = _datasets(coco_s3)
    gt = coco_api_from_dataset(ours)  # raises where the reference would rebuild it
    # the wrapped dataset's own COCO object, built once: the wrapper runs the class's
    # `coco` property on itself, and gets the wrapped dataset's
    assert gt is ours._dataset.coco
    assert coco_api_from_dataset(ours) is gt
    assert coco_api_from_dataset(torch.utils.data.Subset(ours, [0, 1])) is gt
    with pytest.raises(RebuildRefused):
        coco_api_from_dataset([ours[0]])
    ref = coco_api_from_dataset(theirs)
    assert gt.getImgIds() == ref.getImgIds()
    assert gt.getAnnIds() == ref.getAnnIds()
    assert any(a["iscrowd"] for a in gt.loadAnns(gt.getAnnIds()))

    def evaluate(coco: Any) -> list[float]:
        detections = [
            dict(image_id=a["image_id"], category_id=a["category_id"], bbox=a["bbox"], score=1.0)
            for a in coco.loadAnns(coco.getAnnIds())
            if not a["iscrowd"]
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            e = COCOeval(coco, coco.loadRes(detections), "bbox")
            e.evaluate()
            e.accumulate()
            e.summarize()
        return [float(s) for s in e.stats]

    stats = evaluate(gt)
    assert stats == evaluate(ref)
    assert stats[0] == pytest.approx(1.0)
