"""Child-process entry points for the cache integration tests (``test_cache_s3.py``,
``test_faults_dataset.py``).

Each function runs in a real process started by ``multiprocessing`` (fork or spawn,
so they live at module level and take only picklable arguments). A child opens a
:class:`fastload.ShardedDataset` over SeaweedFS through the shared cache directory,
does its part and writes a JSON report to ``out``; the test asserts on the reports,
the exit codes and the fault proxy's counters.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "datasets"))
from ds_helpers import index_of, payload, write_dataset

from fastload.datasets.sharded import ShardedDataset
from fastload.shards.manifest import Manifest

__all__ = [
    "check_sample",
    "fail_main",
    "fetch_entry_main",
    "object_name",
    "open_dataset",
    "read_main",
    "read_order",
    "run_children",
    "write_dataset",
]


def open_dataset(cfg: dict[str, Any]) -> ShardedDataset:
    """The dataset a child reads: ``cfg`` has ``url``, ``cache_dir`` (None: RAM tier),
    ``storage_options`` and optionally ``fetch`` (a FetchConfig) and ``manifest_json``
    (so that opening the dataset sends no request)."""
    manifest = None
    if cfg.get("manifest_json") is not None:
        manifest = Manifest.from_json(cfg["manifest_json"], cfg["url"])
    return ShardedDataset(
        cfg["url"],
        cache_dir=cfg.get("cache_dir"),
        storage_options=cfg["storage_options"],
        fetch=cfg.get("fetch"),
        manifest=manifest,
    )


def check_sample(sample: dict[str, Any], size: int) -> str | None:
    """None if ``sample`` is exactly what ``write_dataset(..., size=size)`` wrote under
    its key, else a description of what is wrong."""
    i = index_of(sample)
    if sample.get("bin") != payload(i, size):
        got = sample.get("bin")
        return f"{sample['__key__']}: bin differs ({len(got) if got is not None else None} bytes)"
    if sample.get("cls") != str(i % 10).encode():
        return f"{sample['__key__']}: cls is {sample.get('cls')!r}"
    return None


def read_order(n: int, order: str, seed: int) -> list[int]:
    """Sample indices in manifest order (``"seq"``), reversed (``"rev"``) or shuffled
    with ``seed`` (``"shuffle"``)."""
    idx = list(range(n))
    if order == "rev":
        idx.reverse()
    elif order == "shuffle":
        random.Random(seed).shuffle(idx)
    return idx


def _write(out: str, doc: dict[str, Any]) -> None:
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, out)


def read_main(cfg: dict[str, Any], barrier: Any, out: str) -> None:
    """Open the dataset, wait at ``barrier`` (if any), read every sample in the order
    ``cfg["order"]`` (with ``cfg["seed"]``), directly or through a torch DataLoader with
    ``cfg["workers"]`` workers, and check each against its payload. Reports samples
    read, distinct keys, the first mismatches and this process's io_stats."""
    try:
        t0 = time.monotonic()
        ds = open_dataset(cfg)
        if barrier is not None:
            barrier.wait(timeout=120)
        t1 = time.monotonic()
        order = read_order(len(ds), cfg.get("order", "seq"), cfg.get("seed", 0))
        size = int(cfg["size"])
        keys: list[str] = []
        bad: list[str] = []
        workers = int(cfg.get("workers", 0))
        if workers:
            import torch.utils.data

            loader = torch.utils.data.DataLoader(
                ds, batch_size=16, sampler=order, num_workers=workers, collate_fn=list
            )
            samples: Any = (s for batch in loader for s in batch)
        else:
            samples = (ds[i] for i in order)
        for s in samples:
            keys.append(s["__key__"])
            problem = check_sample(s, size)
            if problem is not None and len(bad) < 5:
                bad.append(problem)
        doc = {
            "pid": os.getpid(),
            "samples": len(keys),
            "distinct": len(set(keys)),
            "bad": bad,
            "io": ds.io_stats(),
            "retries": ds.source.store.stats().retries,
            "open_s": t1 - t0,
            "read_s": time.monotonic() - t1,
        }
        ds.close()
        _write(out, doc)
    except BaseException:
        _write(out, {"pid": os.getpid(), "error": traceback.format_exc()})
        raise


def fail_main(cfg: dict[str, Any], barrier: Any, out: str) -> None:
    """Open the dataset, wait at ``barrier``, read sample ``cfg["sample"]`` and report
    how that failed: exception class names (MRO), message, seconds taken."""
    doc: dict[str, Any] = {"pid": os.getpid()}
    try:
        ds = open_dataset(cfg)
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        try:
            ds[int(cfg["sample"])]
        except Exception as exc:
            doc["error_types"] = [c.__name__ for c in type(exc).__mro__]
            doc["message"] = str(exc)
        else:
            doc["error_types"] = []
            doc["message"] = ""
        doc["seconds"] = time.monotonic() - t0
        ds.close()
    except BaseException:
        doc["crash"] = traceback.format_exc()
        _write(out, doc)
        raise
    _write(out, doc)


def run_children(
    ctx: Any,
    target: Any,
    cfgs: list[dict[str, Any]],
    workdir: Path,
    tag: str,
    barrier: Any = None,
    timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Start one ``ctx.Process(target=target, args=(cfg, barrier, out))`` per config
    (``ctx`` is one multiprocessing context or a list of them, one per config), join
    them all within ``timeout_s`` (killing and failing on a hang) and return their JSON
    reports; raises AssertionError naming the child when one crashed or reported an
    error."""
    ctxs = ctx if isinstance(ctx, list) else [ctx] * len(cfgs)
    outs = [workdir / f"{tag}-{k}.json" for k in range(len(cfgs))]
    procs = [
        c.Process(target=target, args=(cfg, barrier, str(out)), name=f"{tag}-{k}")
        for k, (c, cfg, out) in enumerate(zip(ctxs, cfgs, outs, strict=True))
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p.name for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"children still running after {timeout_s:.0f} s: {hung}"
    reports = []
    for p, out in zip(procs, outs, strict=True):
        doc = json.loads(out.read_text()) if out.exists() else {"error": "(no report)"}
        problem = doc.get("error") or doc.get("crash")
        if p.exitcode != 0 or problem:
            raise AssertionError(f"{p.name} (pid {p.pid}) exited {p.exitcode}: {problem or doc}")
        reports.append(doc)
    return reports


def object_name(target: str) -> str:
    """The object's base name in a proxied request target (``/bucket/ds/shard.tar?x``)."""
    from urllib.parse import unquote

    return unquote(target.split("?", 1)[0]).rstrip("/").rsplit("/", 1)[-1]


def fetch_entry_main(cfg: dict[str, Any], barrier: Any, out: str) -> None:
    """Fetch one object (``cfg["name"]``, ``cfg["size"]``, ``cfg["checksum"]``) of the
    dataset at ``cfg["url"]`` into the disk tier at ``cfg["cache_dir"]`` with
    ``DiskTier.get``, as a ShardSource would; reports the entry's local path."""
    from fastload.cache import DiskTier, EntryKey
    from fastload.cache.shard_cache import dataset_id
    from fastload.storage import open_store

    try:
        store = open_store(cfg["url"], cfg["storage_options"], cfg.get("fetch"))
        tier = DiskTier(cfg["cache_dir"])
        if barrier is not None:
            barrier.wait(timeout=120)
        key = EntryKey(dataset_id(cfg["url"]), cfg["name"], cfg["checksum"])
        name, size = cfg["name"], int(cfg["size"])
        path = tier.get(key, size, lambda f: store.download(name, f, expected_size=size))
        tier.close()
        _write(out, {"pid": os.getpid(), "path": str(path)})
    except BaseException:
        _write(out, {"pid": os.getpid(), "error": traceback.format_exc()})
        raise
