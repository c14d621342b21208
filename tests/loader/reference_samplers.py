"""Samplers as torchvision's training references define them, written out here so the
loader tests do not depend on torchvision's ``references/`` folder (not installed).

* :class:`GroupedBatchSampler`: ``references/detection/group_by_aspect_ratio.py``'s
  aspect-ratio grouping: index lists of one group, in the base sampler's order, the
  leftover groups filled up from their own samples so an epoch has ``len(self)``
  batches.
* :class:`RepeatAugSampler`: ``references/classification/sampler.py``'s ``RASampler``
  (repeated augmentation): each index repeated over the ranks, shuffled by
  ``seed + epoch``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence

import torch
import torch.utils.data


def _repeat_to_at_least(items: Sequence[int], n: int) -> list[int]:
    times = math.ceil(n / len(items))
    return [i for _ in range(times) for i in items]


class GroupedBatchSampler(torch.utils.data.BatchSampler):
    """Batches of ``batch_size`` indices of one group each (``group_ids[i]``)."""

    def __init__(
        self, sampler: torch.utils.data.Sampler[int], group_ids: Sequence[int], batch_size: int
    ) -> None:
        if not isinstance(sampler, torch.utils.data.Sampler):
            raise ValueError(f"sampler should be a torch.utils.data.Sampler, got {sampler}")
        self.sampler = sampler
        self.group_ids = group_ids
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        buffer_per_group: dict[int, list[int]] = defaultdict(list)
        samples_per_group: dict[int, list[int]] = defaultdict(list)
        num_batches = 0
        for idx in self.sampler:
            group = self.group_ids[idx]
            buffer_per_group[group].append(idx)
            samples_per_group[group].append(idx)
            if len(buffer_per_group[group]) == self.batch_size:
                yield buffer_per_group[group]
                num_batches += 1
                del buffer_per_group[group]
        remaining = len(self) - num_batches
        if remaining > 0:
            groups = sorted(buffer_per_group.items(), key=lambda kv: len(kv[1]), reverse=True)
            for group, _ in groups:
                missing = self.batch_size - len(buffer_per_group[group])
                fill = _repeat_to_at_least(samples_per_group[group], missing)
                buffer_per_group[group].extend(fill[:missing])
                yield buffer_per_group[group]
                remaining -= 1
                if remaining == 0:
                    break

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size  # type: ignore[arg-type]


class RepeatAugSampler(torch.utils.data.Sampler[int]):
    """Each index ``repetitions`` times, spread over ``num_replicas`` ranks; the
    order is a permutation by ``seed + epoch`` (``set_epoch``)."""

    def __init__(
        self,
        dataset_len: int,
        num_replicas: int,
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        repetitions: int = 3,
    ) -> None:
        self.n = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.repetitions = repetitions
        self.epoch = 0
        self.num_samples = math.ceil(dataset_len * repetitions / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.num_selected = math.floor(dataset_len // 256 * 256 / num_replicas) or (
            math.ceil(dataset_len / num_replicas)
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.n, generator=g).tolist()
        else:
            indices = list(range(self.n))
        indices = [i for i in indices for _ in range(self.repetitions)]
        indices += indices[: self.total_size - len(indices)]
        mine = indices[self.rank : self.total_size : self.num_replicas]
        return iter(mine[: self.num_selected])

    def __len__(self) -> int:
        return self.num_selected
