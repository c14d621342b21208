"""One pod of ``benchmarks/soak.py``: a training process reading the soak's datasets
through ``fastload.DataLoader`` (2 workers) over one shared, tightly capped cache,
checking every byte of every sample, until the driver asks it to stop (or kills it).

``python soak_pod.py CONFIG POD INCARNATION``. The driver runs it as PID 1 of its own
PID namespace where it can (``unshare --pid --fork --mount-proc``). Every half second,
and when it ends, it writes its counters to ``WORK/progress-POD-INCARNATION.json``
(atomically): the samples it checked, the wrong ones, the reads fastload refused with
a clear error (a :class:`fastload.FastloadError`: a shard re-converted under the
reader, a full disk), the unexpected exceptions (any other: a failure), and the time
of its last progress, a sample or a refusal (the driver's stall clock).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def payload(dataset: str, version: int, key: str, size: int) -> bytes:
    """The bytes of sample ``key`` of ``dataset`` at ``version``: a header naming them,
    then ``size`` bytes drawn from their hash (so any sample can be checked alone)."""
    head = f"{dataset}|{version}|{key}|{size}|".encode()
    seed = hashlib.blake2b(head, digest_size=32).digest()
    body = random.Random(seed).randbytes(size)
    return head + body


def check(dataset: str, sample: Any) -> bool:
    """Whether ``sample`` is exactly what :func:`payload` wrote for its key."""
    key = sample["__key__"]
    data = bytes(sample["bin"])
    try:
        name, version, k, size, _ = data.split(b"|", 4)
        ok = name.decode() == dataset and k.decode() == key
        return ok and data == payload(dataset, int(version), key, int(size))
    except (ValueError, UnicodeDecodeError):
        return False


def keep(batch: list[Any]) -> list[Any]:
    """Collate: the batch as a list of samples (picklable for the workers)."""
    return batch


class Counters:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples = 0
        self.wrong = 0
        self.refused = 0
        self.unexpected = 0
        self.messages: list[str] = []
        self.last_progress = time.time()  # a sample checked or a clear refusal
        self.started = time.time()
        self._flushed = 0.0
        self.flush(force=True)

    def note(self, kind: str, text: str) -> None:
        if len(self.messages) < 8:
            self.messages.append(f"{kind}: {text[:600]}")

    def flush(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._flushed < 0.5:
            return
        self._flushed = now
        doc = {
            "samples": self.samples,
            "wrong": self.wrong,
            "refused": self.refused,
            "unexpected": self.unexpected,
            "last_progress": self.last_progress,
            "started": self.started,
            "messages": self.messages,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)


def run(cfg: dict[str, Any], pod: int, incarnation: int) -> int:
    import fastload

    work = Path(cfg["work"])
    counters = Counters(work / f"progress-{pod}-{incarnation}.json")
    rng = random.Random(pod * 1_000_003 + incarnation)
    stop = work / "stop"
    opts = cfg["storage_options"]
    try:
        while not stop.exists():
            name = rng.choice(sorted(cfg["datasets"]))
            url = cfg["datasets"][name]
            kind = rng.choice(("sharded", "streaming"))
            loader = None
            try:
                common: dict[str, Any] = {
                    "cache_dir": cfg["cache_dir"],
                    "cache_limit": cfg["cache_limit"],
                    "storage_options": opts,
                }
                if kind == "sharded":
                    ds: Any = fastload.ShardedDataset(url, **common)
                    loader = fastload.DataLoader(
                        ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=keep
                    )
                else:
                    ds = fastload.StreamingDataset(url, shuffle=True, **common)
                    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=keep)
                for batch in loader:
                    for sample in batch:
                        counters.samples += 1
                        if not check(name, sample):
                            counters.wrong += 1
                            counters.note("wrong", f"{name} {sample.get('__key__')}")
                    counters.last_progress = time.time()
                    counters.flush()
                    if stop.exists():
                        break
            except fastload.FastloadError as exc:  # a clear refusal: counted, not a failure
                counters.refused += 1
                counters.last_progress = time.time()
                counters.note("refused", f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)
            except KeyboardInterrupt:
                raise
            except Exception:
                counters.unexpected += 1
                counters.note("unexpected", traceback.format_exc())
                time.sleep(0.2)
            finally:
                if loader is not None:
                    close = getattr(loader, "close", None)
                    if close is not None:
                        close()
            counters.flush()
    except KeyboardInterrupt:
        counters.flush(force=True)
        return 130
    counters.flush(force=True)
    return 0


if __name__ == "__main__":
    import faulthandler
    import signal

    # the driver sends SIGUSR1 to a pod that does not exit after Ctrl-C: every thread's
    # stack goes to the pod's log before it is killed
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config = json.loads(Path(sys.argv[1]).read_text())
    sys.exit(run(config, int(sys.argv[2]), int(sys.argv[3])))
