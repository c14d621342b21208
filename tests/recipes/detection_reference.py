"""What torchvision's detection reference (``references/detection``: ``presets.py``,
``group_by_aspect_ratio.py``, ``coco_utils.py``, ``utils.py``) does with a dataset,
written out here (the ``references/`` folder is not installed) for the recipe tests
and ``benchmarks/bench_recipe.py``. ``GroupedBatchSampler`` is in
``tests/loader/reference_samplers.py``.

* :func:`train_transforms`: ``DetectionPresetTrain(data_augmentation="hflip",
  backend="pil", use_v2=True)``: flip, ``ToImage``, ``ToDtype(float, scale=True)``,
  boxes to XYXY, ``SanitizeBoundingBoxes``, ``ToPureTensor``.
* :func:`remove_images_without_annotations`: ``get_coco``'s filter for the training
  set (``_coco_remove_images_without_annotations``): a ``Subset`` of the images with
  an annotation whose box is more than 1 pixel wide and high, found through
  ``dataset.ids`` and ``dataset.coco`` (it asserts a torchvision ``CocoDetection``).
* :func:`aspect_ratio_groups`: ``create_aspect_ratio_groups(dataset, k)``: the
  aspect ratios from ``dataset.coco.imgs`` (its fast path for a ``CocoDetection``,
  through a ``Subset``'s indices), quantized into ``2k + 1`` bins spaced evenly in
  log2 between 1/2 and 2.
* :func:`coco_api_from_dataset`: ``get_coco_api_from_dataset``: ``dataset.coco`` of a
  ``torchvision.datasets.CocoDetection`` (through up to 10 ``Subset`` layers);
  anything else has its COCO object rebuilt from every target (here: refused, so a
  test sees which path ran).
* :func:`collate_fn`: ``utils.collate_fn``, a batch as a tuple of per-field tuples.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import torch
import torch.utils.data
import torchvision
from torchvision import tv_tensors
from torchvision.transforms import v2


def train_transforms(hflip_prob: float = 0.5) -> Any:
    return v2.Compose(
        [
            v2.RandomHorizontalFlip(p=hflip_prob),
            v2.ToImage(),
            v2.ToDtype(torch.float, scale=True),
            v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
            v2.SanitizeBoundingBoxes(),
            v2.ToPureTensor(),
        ]
    )


def remove_images_without_annotations(dataset: Any) -> torch.utils.data.Subset[Any]:
    assert isinstance(dataset, torchvision.datasets.CocoDetection)

    def valid(anns: list[dict[str, Any]]) -> bool:
        return any(all(side > 1 for side in a["bbox"][2:]) for a in anns)

    keep = [
        i
        for i, image_id in enumerate(dataset.ids)
        if valid(dataset.coco.loadAnns(dataset.coco.getAnnIds(imgIds=image_id, iscrowd=None)))
    ]
    return torch.utils.data.Subset(dataset, keep)


def aspect_ratio_groups(dataset: Any, k: int = 3) -> list[int]:
    indices = None
    if isinstance(dataset, torch.utils.data.Subset):
        dataset, indices = dataset.dataset, dataset.indices
    ids = dataset.ids if indices is None else [dataset.ids[i] for i in indices]
    ratios = []
    for image_id in ids:
        info = dataset.coco.imgs[image_id]
        ratios.append(float(info["width"]) / float(info["height"]))
    bins = sorted((2 ** np.linspace(-1, 1, 2 * k + 1)).tolist()) if k > 0 else [1.0]
    return [bisect.bisect_right(bins, r) for r in ratios]


class RebuildRefused(AssertionError):
    """The dataset is not a torchvision ``CocoDetection``: the reference would rebuild
    its COCO object from every target."""


def coco_api_from_dataset(dataset: Any) -> Any:
    for _ in range(10):
        if isinstance(dataset, torchvision.datasets.CocoDetection):
            break
        if isinstance(dataset, torch.utils.data.Subset):
            dataset = dataset.dataset
    if isinstance(dataset, torchvision.datasets.CocoDetection):
        return dataset.coco
    raise RebuildRefused(f"{type(dataset).__name__} is not a torchvision CocoDetection")


def collate_fn(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))
