"""One rank of a real multi-process job over token shards (spawned by
test_tokens_distributed.py): joins a gloo group, iterates a TokenDataset through
fastload.DataLoader with workers, and writes the windows it saw as JSON."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import fastload


def _windows(batch: list[dict[str, torch.Tensor]]) -> list[list[int]]:
    return [x["input_ids"].tolist() for x in batch]


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method="env://")
    ds = fastload.TokenDataset(
        cfg["url"],
        seq_len=cfg["seq_len"],
        cache_dir=cfg["cache_dir"],
        storage_options=cfg["storage_options"],
        shuffle=True,
        seed=cfg["seed"],
        drop_last=True,
    )
    # default_collate: the loader builds int64 batches itself (no worker process)
    collate = None if cfg.get("default_collate") else _windows
    loader = fastload.DataLoader(
        ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"], collate_fn=collate,
        drop_last=True,
    )  # fmt: skip
    if cfg.get("load_state"):
        with open(cfg["load_state"]) as f:
            loader.load_state_dict(json.load(f))
    seen: list[list[list[int]]] = []
    stop = cfg.get("stop_after")
    for batch in loader:
        seen.append(batch["input_ids"].tolist() if collate is None else batch)
        if stop is not None and len(seen) == stop:
            break
    state = loader.state_dict()
    states: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    with open(cfg["out"], "w") as f:
        json.dump({"batches": seen, "state": state, "states_equal": all(s == state for s in states),
                   "io": loader.io_stats(), "worker_processes": loader.worker_processes,
                   "transport": loader.transport}, f)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    ds.close()


if __name__ == "__main__":
    main()
