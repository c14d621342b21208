"""The baselines a benchmark compares fastload to, measured in the same run.

* :class:`ObjectsDataset`: the naive map-style dataset of most training scripts —
  one GET per sample through a plain fsspec/s3fs filesystem (one object per image);
* :class:`ShardsDataset`: the same shards fastload reads, without its cache — a
  plain fsspec ``cat`` of each whole shard, then ``tarfile`` parsing per sample.

Both run through a plain ``torch.utils.data.DataLoader`` with the benchmark's
worker count (:func:`run_baseline`).
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastload.bench.tiers import TierResult, quiet_inherited_loops
from fastload.storage import is_s3_like, join, resolve_s3, split_url

__all__ = ["ObjectsDataset", "ShardsDataset", "fsspec_target", "run_baseline"]


def fsspec_target(
    url: str, storage_options: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """``(url, kwargs)`` for a plain fsspec filesystem on ``url``: ``s3://``/``cos://``
    become s3fs keyword arguments (endpoint, credentials, region) resolved the same
    way fastload resolves them, with s3fs's own defaults for everything else."""
    if not is_s3_like(url):
        return url, dict(storage_options or {})
    s = resolve_s3(url, storage_options)
    client_kwargs = dict(s.client_kwargs)
    if s.endpoint_url:
        client_kwargs["endpoint_url"] = s.endpoint_url
    region = s.region or ("us-east-1" if s.endpoint_url else None)
    if region:
        client_kwargs["region_name"] = region
    config_kwargs = dict(s.config_kwargs)
    if s.virtual_hosted:
        config_kwargs.setdefault("s3", {"addressing_style": "virtual"})
    kwargs: dict[str, Any] = {
        "key": s.key,
        "secret": s.secret,
        "token": s.token,
        "anon": s.anon,
        "client_kwargs": client_kwargs,
        "config_kwargs": config_kwargs,
        "skip_instance_cache": True,
        **s.extra,
    }
    return f"s3://{s.bucket}/{s.prefix}".rstrip("/"), kwargs


class _FsDataset:
    """One item per object ``names[i]`` below ``root``, read through a fsspec filesystem
    made lazily in each process (fork/spawn safe)."""

    def __init__(
        self, root: str, names: Sequence[str], storage_options: Mapping[str, Any] | None = None
    ) -> None:
        self.root, self._kwargs = fsspec_target(root, storage_options)
        self.names = list(names)
        self._fs: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.names)

    def _filesystem(self) -> tuple[Any, str]:
        import fsspec

        if self._fs is None or self._pid != os.getpid():
            self._fs, path = fsspec.core.url_to_fs(self.root, **self._kwargs)
            self._path = str(path)
            self._pid = os.getpid()
        return self._fs, self._path

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"], state["_pid"] = None, -1
        return state


class ObjectsDataset(_FsDataset):
    """One GET per sample: ``ds[i]`` is ``{"__key__": name, "data": bytes}`` of object
    ``names[i]`` below ``root``."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        fs, path = self._filesystem()
        name = self.names[i]
        return {"__key__": name, "data": fs.cat_file(join(path, name))}


class ShardsDataset(_FsDataset):
    """One whole-shard GET per item, then tar parsing: ``ds[i]`` is ``(samples, bytes)``
    of shard ``names[i]`` (only counts cross the process boundary)."""

    def __getitem__(self, i: int) -> tuple[int, int]:
        fs, path = self._filesystem()
        data = fs.cat_file(join(path, self.names[i]))
        samples = total = 0
        last_key = None
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                f = tar.extractfile(member)
                payload = f.read() if f is not None else b""
                dirname, _, base = member.name.rpartition("/")
                key = (dirname + "/" if dirname else "") + base.split(".", 1)[0]
                if key != last_key:
                    samples += 1
                    last_key = key
                total += len(payload)
        return samples, total


def _collate_list(batch: list[Any]) -> list[Any]:
    return batch


def run_baseline(
    dataset: ObjectsDataset | ShardsDataset,
    workers: int,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> TierResult:
    """One epoch of ``dataset`` through a plain torch DataLoader with ``workers``
    workers; returns samples, bytes and time. ``extra["kind"]`` is ``"objects"`` or
    ``"shards"``."""
    import torch.utils.data

    objects = isinstance(dataset, ObjectsDataset)
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=batch_size if objects else None,
        num_workers=workers,
        collate_fn=_collate_list if objects else None,
        shuffle=False,
        worker_init_fn=quiet_inherited_loops if workers else None,
    )
    n = total = 0
    start = time.perf_counter()
    for item in loader:
        if objects:
            n += len(item)
            total += sum(len(s["data"]) for s in item)
            step = len(item)
        else:
            samples, nbytes = (int(v) for v in item)
            n += samples
            total += nbytes
            step = samples
        if progress is not None:
            progress(step)
    seconds = time.perf_counter() - start
    protocol = split_url(dataset.root)[0]
    return TierResult(
        n,
        total,
        seconds,
        {
            "kind": "objects" if objects else "shards",
            "workers": workers,
            "protocol": protocol,
            "requests": len(dataset),
        },
    )
