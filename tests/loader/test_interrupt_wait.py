"""Ctrl-C reaches a training loop that waits for a batch, whichever thread the kernel
gives the signal to.

A process-directed SIGINT goes to any thread that does not block it; when a fastload
thread takes it, Python only sets its flag, and the main thread raises
KeyboardInterrupt when it next runs bytecode. The loader's main thread therefore waits
for a batch in short slices, never in one untimed wait (benchmarks/soak.py found pods
still waiting 30 s after Ctrl-C while a batch's builder was blocked)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from fastload.datasets.source import ShardSource
from fastload.loader import DataLoader
from fastload.shards.writer import ShardWriter


class Blocking(torch.utils.data.Dataset[bytes]):
    """The build_item protocol; building an item blocks until the test releases it."""

    batch_transport = True

    def __init__(self, url: str) -> None:
        self.source = ShardSource(url)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()

    def __len__(self) -> int:
        return len(self.source)

    def build_item(self, sample: Any) -> bytes:
        self.entered.set()
        self.release.wait(60)
        self.returned.set()
        return bytes(sample["bin"])

    def __getitem__(self, i: int) -> bytes:
        return self.build_item(self.source.read(i))


def test_ctrl_c_taken_by_another_thread_interrupts_the_wait_for_a_batch(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with ShardWriter(url) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * 64})
    ds = Blocking(url)
    loader = DataLoader(ds, batch_size=2, transport="cache", collate_fn=list)
    assert loader.transport_plan.transport == "cache"

    def press_ctrl_c() -> None:
        ds.entered.wait(30)
        # the signal lands on this thread, not the main one: only the flag is set
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c)
    try:
        presser.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                pass
        # raised while the batch's build was still blocked, not after it came back
        assert not ds.returned.is_set()
    finally:
        ds.release.set()
        presser.join()
        loader.close()
        ds.source.close()
