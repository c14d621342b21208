"""A child process of tests/cache/test_one_cap.py: one writer of one kind under the
shared cap, reading everything it writes back and comparing it with the source.

``python onecap_child.py <kind> <cache_dir> <spec.json> <out.json>``; ``kind`` is
``raw`` (shards over SeaweedFS), ``pixels`` (the decoded-pixel tier), ``tokens``
(``ParquetTokenDataset``) or ``items`` (``fastload.cached()``). Writes
``{"kind", "rounds", "samples", "mismatches"}``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "text"))


class Items:
    """A slow-to-make map-style dataset: item ``i`` is 2 KiB derived from ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        return hashlib.sha256(str(i).encode()).digest() * 64


def item_ref(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 64


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if hasattr(b, "numpy"):
        return tuple(a.shape) == tuple(b.shape) and np.array_equal(a.numpy(), b.numpy())
    return bool(a == b)


def run(kind: str, cache_dir: str, spec: dict[str, Any]) -> tuple[int, list[str]]:
    bad: list[str] = []
    samples = 0
    opts = spec.get("storage_options")
    if kind in ("raw", "pixels"):
        from fastload.datasets.sharded import ShardedDataset
        from fastload.decode import Decoder

        ref = ShardedDataset(spec["url"], storage_options=opts)  # RAM only: the source
        if kind == "raw":
            ds = ShardedDataset(spec["url"], cache_dir=cache_dir, storage_options=opts)
            want = ref.__getitem__
        else:
            ds = ShardedDataset(spec["url"], cache_dir=cache_dir, storage_options=opts,
                                decode="tensor", size=spec["size"], pixel_cache=True)  # fmt: skip
            fresh = Decoder(image="tensor", size=spec["size"])

            def want(i: int) -> Any:
                return fresh(ref[i])

        for _ in range(spec["rounds"]):
            for i in range(len(ds)):
                samples += 1
                if not _same(ds[i], want(i)):
                    bad.append(f"{kind}:{i}")
        ds.close()
        ref.close()
    elif kind == "tokens":
        from text_helpers import converted_stream, reference_windows

        from fastload import ParquetTokenDataset
        from fastload.sampling import World

        ref_windows = reference_windows(
            converted_stream(spec["tokenizer"], spec["docs"], spec["eos"]), 32
        )
        for _ in range(spec["rounds"]):
            tds = ParquetTokenDataset(
                spec["parquet"], tokenizer=spec["tokenizer"], seq_len=32, cache_dir=cache_dir,
                world=World.single(), shuffle=False,
            )  # fmt: skip
            got = [x["input_ids"].tolist() for x in tds]
            samples += len(got)
            if got != [list(w[0]) for w in ref_windows]:
                bad.append("tokens")
            del tds
    elif kind == "items":
        import fastload

        for _ in range(spec["rounds"]):
            ds = fastload.cached(Items(spec["n"]), cache_dir=cache_dir, key="onecap-items",
                                 shard_size="64KB", key_file=spec["key_file"])  # fmt: skip
            for i in range(len(ds)):
                samples += 1
                if ds[i] != item_ref(i):
                    bad.append(f"items:{i}")
            ds.close()
    else:
        raise SystemExit(f"unknown kind {kind}")
    return samples, bad


def main() -> int:
    kind, cache_dir, spec_path, out = sys.argv[1:5]
    with open(spec_path) as f:
        spec = json.load(f)
    samples, bad = run(kind, cache_dir, spec)
    with open(out, "w") as f:
        json.dump({"kind": kind, "rounds": spec["rounds"], "samples": samples,
                   "mismatches": bad}, f)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
