"""One rank of a real multi-process job (spawned by test_distributed.py).

Reads its settings from a JSON file named in argv[1]; joins a gloo process group
(torchrun's variables are set by the test), iterates a StreamingDataset through
fastload.DataLoader and writes what it saw to the output file named in the settings.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import fastload


def _keys(batch: list[dict[str, object]]) -> list[str]:
    return [str(s["__key__"]) for s in batch]


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method=cfg["init_method"])
    ds = fastload.StreamingDataset(
        cfg["url"],
        shuffle=True,
        seed=cfg["seed"],
        cache_dir=cfg["cache_dir"],
        storage_options=cfg["storage_options"],
        drop_last=cfg["drop_last"],
    )
    loader = fastload.DataLoader(
        ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"], collate_fn=_keys
    )
    if cfg.get("load_state"):
        with open(cfg["load_state"]) as f:
            loader.load_state_dict(json.load(f))
    seen: list[list[str]] = []
    stop = cfg.get("stop_after")
    for batch in loader:
        seen.append(batch)
        if stop is not None and len(seen) == stop:
            break
    state = loader.state_dict()
    count = torch.tensor([len(seen)])
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    states: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    with open(cfg["out"], "w") as f:
        json.dump(
            {
                "rank": dist.get_rank(),
                "batches": seen,
                "all_counts": [int(c) for c in counts],
                "state": state,
                "states_equal": all(s == state for s in states),
            },
            f,
        )
    dist.barrier()
    dist.destroy_process_group()
    ds.close()


if __name__ == "__main__":
    main()
