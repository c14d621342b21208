"""One rank of a real multi-process job over a mixture on SeaweedFS (spawned by
test_mix_seaweed.py): a token dataset and two sample datasets mixed by weight,
iterated through fastload.DataLoader with worker processes; writes the items it saw
(as the ids of mix_helpers) and the loader's state as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from ds_helpers import index_of
from mix_helpers import BASE

import fastload


def ids(batch: list[dict[str, Any]]) -> list[int]:
    """Token items name themselves by their token; samples by source and key."""
    out = []
    for item in batch:
        if "input_ids" in item:
            out.append(int(item["input_ids"][0]))
        else:
            out.append(item["source"] * BASE + index_of(item))
    return out


def sources(cfg: dict[str, Any]) -> list[Any]:
    """The mixture's sources, reading through ``cfg["cache_dir"]`` when given."""
    common = {"storage_options": cfg["storage_options"], "cache_dir": cfg.get("cache_dir")}
    tokens, a, b = cfg["urls"]
    return [
        fastload.TokenDataset(tokens, seq_len=1, shuffle=True, **common),
        fastload.StreamingDataset(a, **common),
        fastload.ShardedDataset(b, **common),
    ]


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    ds = fastload.Mix(sources(cfg), weights=[0.5, 0.3, 0.2], seed=7, source_field="source")
    loader = fastload.DataLoader(
        ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"], collate_fn=ids
    )
    if cfg.get("load_state"):
        with open(cfg["load_state"]) as f:
            loader.load_state_dict(json.load(f))
    seen: list[list[int]] = []
    stop = cfg.get("stop_after")
    for batch in loader:
        seen.append(batch)
        if stop is not None and len(seen) == stop:
            break
    state = loader.state_dict()
    with open(cfg["out"], "w") as f:
        json.dump({"batches": seen, "state": state, "io": loader.io_stats(),
                   "worker_processes": loader.worker_processes}, f)  # fmt: skip
    loader.close()


if __name__ == "__main__":
    main()
