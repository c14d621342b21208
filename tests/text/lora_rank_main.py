"""One rank of a 2-rank LoRA fine-tune (spawned by test_lora_distributed.py the way
torchrun starts one): joins a gloo group, wraps a tiny peft LoRA LLaMA in DDP, trains
on fastload.DataLoader(TokenDataset(labels="hf")) with drop_last=True, and writes the
labels of every batch it trained on as JSON. ``stop``: save the loader state (rank 0)
and the adapter after that many steps and exit; ``resume``: load both first."""

from __future__ import annotations

import json
import os
import sys

from support.torchvision_shim import register

register()  # transformers/peft import torchvision (tests/support/torchvision_shim.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fastload  # noqa: E402
from fastload.hf import load_loader_state, save_loader_state  # noqa: E402
from support.tiny_llama import tiny_lora  # noqa: E402


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method="env://")
    model = tiny_lora(cfg["vocab"], seq_len=cfg["seq_len"], task_type=None)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ds = fastload.TokenDataset(
        cfg["url"], seq_len=cfg["seq_len"], labels="hf", shuffle=True, seed=3,
        cache_dir=cfg["cache_dir"], storage_options=cfg["storage_options"],
    )  # fmt: skip
    loader = fastload.DataLoader(ds, batch_size=2, drop_last=True)
    ckpt = cfg["ckpt"]
    if cfg.get("resume"):
        assert load_loader_state(loader, ckpt)
        model.load_state_dict(torch.load(os.path.join(ckpt, "model.pt")), strict=False)
        opt.load_state_dict(torch.load(os.path.join(ckpt, "opt.pt")))
    seen: list[list[int]] = []
    losses: list[float] = []
    steps = cfg.get("done", 0)
    start = loader.state_dict()["epoch"]
    for epoch in range(start, cfg["epochs"]):
        loader.set_epoch(epoch)
        for batch in loader:
            seen.extend(batch["labels"].tolist())
            loss = ddp(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            steps += 1
            if steps == cfg.get("stop"):
                if dist.get_rank() == 0:
                    save_loader_state(loader, ckpt)
                    trained = {k: v for k, v in model.state_dict().items() if "lora" in k}
                    torch.save(trained, os.path.join(ckpt, "model.pt"))
                    torch.save(opt.state_dict(), os.path.join(ckpt, "opt.pt"))
                dist.barrier()
                break
        else:
            continue
        break
    report = {"labels": seen, "losses": losses, "batches": loader.stats().batches,
              "per_epoch": len(loader)}  # fmt: skip
    with open(cfg["out"], "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
