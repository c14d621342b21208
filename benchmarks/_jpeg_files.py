"""The naive local baseline of the epoch benchmarks (``bench_epoch.py`` and the
transport benchmark's decode section): JPEG files read and decoded one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.utils.data

from _epoch_common import plain_decode_tensor


class JpegFiles(torch.utils.data.Dataset[tuple[Any, int]]):
    """Item ``i``: open file ``paths[i]``, decode and resize it per sample with PIL
    (:func:`_epoch_common.plain_decode_tensor`); its label is ``labels[i]``, or ``i``
    without ``labels``."""

    def __init__(self, paths: list[Path], labels: list[int] | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return plain_decode_tensor(data), (i if self.labels is None else self.labels[i])
