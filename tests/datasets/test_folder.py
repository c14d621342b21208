"""fastload.ImageFolder returns what torchvision's ImageFolder returns on the originals.

The reference is torchvision's ``find_classes`` / ``make_dataset`` / ``pil_loader``
spelled out, so these tests run where torchvision is absent
(``test_torchvision_dropins.py`` compares with torchvision itself): classes are the
sorted subdirectory names, each class's files a sorted recursive walk filtered by
extension, and an item ``(Image.open(path).convert("RGB"), class index)``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import convert
from fastload.convert.synthetic import make_coco, make_folder
from fastload.errors import ConfigError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ReferenceImageFolder:
    """torchvision.datasets.ImageFolder, as its source reads."""

    def __init__(self, root: str) -> None:
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for c in self.classes:
            for dirpath, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for f in sorted(files):
                    if f.lower().endswith(EXTENSIONS):
                        self.samples.append((os.path.join(dirpath, f), self.class_to_idx[c]))
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        path, target = self.samples[i]
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB"), target


@pytest.fixture(scope="module")
def folder_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("folder")
    root = make_folder(base / "src", classes=4, per_class=5, seed=3, size=(40, 30))
    out = str(base / "shards")
    convert.folder(root, out, shard_size="20KB", progress=False)
    return root, out


def test_every_item_equals_torchvision(folder_data: tuple[str, str]) -> None:
    root, out = folder_data
    ref = ReferenceImageFolder(root)
    ds = fastload.ImageFolder(out)
    assert len(ds.manifest.shards) > 1
    assert len(ds) == len(ref) == 20
    assert ds.classes == ref.classes
    assert ds.class_to_idx == ref.class_to_idx
    assert ds.targets == ref.targets
    assert [t for _, t in ds.samples] == ref.targets
    assert ds.imgs == ds.samples
    assert len({name for name, _ in ds.samples}) == len(ds)
    assert all(name.startswith(out) for name, _ in ds.samples)
    assert ds.root == out
    for i in range(len(ref)):
        image, target = ds[i]
        ref_image, ref_target = ref[i]
        assert image.mode == "RGB"
        assert image.size == ref_image.size
        np.testing.assert_array_equal(np.asarray(image), np.asarray(ref_image))
        assert target == ref_target
        assert isinstance(target, int)


def test_transforms_and_pickling(folder_data: tuple[str, str]) -> None:
    _, out = folder_data
    plain = fastload.ImageFolder(out)
    ds = fastload.ImageFolder(out, transform=np.asarray, target_transform=lambda t: t * 10)
    image, target = ds[7]
    ref_image, ref_target = plain[7]
    np.testing.assert_array_equal(image, np.asarray(ref_image))
    assert target == ref_target * 10
    clone = pickle.loads(pickle.dumps(fastload.ImageFolder(out, transform=np.asarray)))
    np.testing.assert_array_equal(clone[7][0], image)
    assert repr(plain) == f"ImageFolder({out!r}, samples=20, classes=4)"


def test_torch_dataloader_with_worker_processes(folder_data: tuple[str, str]) -> None:
    import torch.utils.data

    _, out = folder_data
    ds: Any = fastload.ImageFolder(out, transform=np.asarray)
    loader: Any = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=list)
    got = [item for batch in loader for item in batch]
    assert [t for _, t in got] == ds.targets


def test_refuses_a_dataset_that_is_not_a_folder(tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "src", num_images=3, size=(16, 16), seed=1)
    convert.coco(images, ann, str(tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match="not an image-folder dataset"):
        fastload.ImageFolder(str(tmp_path / "out"))


def test_a_cache_config_reaches_the_shards(folder_data: tuple[str, str], tmp_path: Path) -> None:
    _, url = folder_data
    config = fastload.CacheConfig(cache_dir=str(tmp_path / "nvme"), ram_limit="1GB")
    ds = fastload.ImageFolder(url, cache_config=config)
    assert ds.source.cache_config.cache_dir == str(tmp_path / "nvme")
    assert ds.source.cache_config.ram_limit == 10**9
    ds[0]
    assert any((tmp_path / "nvme").rglob("*"))
