"""A distributed job of real processes on this machine, started the way torchrun starts
one: the tests of ranks over SeaweedFS (``integration/test_distributed.py``,
``text/test_tokens_distributed.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.seaweed import free_port


def run_ranks(
    script: Path,
    tmp: Path,
    tag: str,
    nodes: int,
    ranks_per_node: int,
    cfg: dict[str, Any],
    timeout: float,
) -> list[dict[str, Any]]:
    """Run ``nodes * ranks_per_node`` processes of ``script`` with torchrun's
    environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` on a free port, and this process's
    ``sys.path``), each given the path of a JSON file: ``cfg`` plus ``cache_dir`` (one
    per node, under ``tmp``) and ``out`` (where the rank writes its JSON report). Each
    must exit 0 within ``timeout`` seconds; returns the reports in rank order."""
    world = nodes * ranks_per_node
    port = str(free_port())
    procs, outs = [], []
    for rank in range(world):
        node, local = divmod(rank, ranks_per_node)
        out = tmp / f"{tag}-rank{rank}.json"
        cfg_path = tmp / f"{tag}-rank{rank}-cfg.json"
        cfg_path.write_text(
            json.dumps({**cfg, "cache_dir": str(tmp / f"cache-node{node}"), "out": str(out)})
        )
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(ranks_per_node),
            "GROUP_RANK": str(node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
        procs.append(subprocess.Popen([sys.executable, str(script), str(cfg_path)], env=env))
        outs.append(out)
    for p in procs:
        assert p.wait(timeout=timeout) == 0
    return [json.loads(o.read_text()) for o in outs]
