"""One "pod" of ``test_full.py``: run as PID 1 of its own PID namespace
(``unshare --pid --fork --mount-proc``), sharing a cache directory with another pod.

``python pod_full.py ROLE ROOT WORK``: role ``holder`` pins shards 0 and 1 and holds
them until the reader is done, then checks their bytes; role ``reader`` reads shards 2-5
keeping the previous shard open while it opens the next (its open set: 2 shards), so
that beside the holder's pins some opens cannot fit under the cap. It measures the
cache directory with ``du`` after every open and reports its counters.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cache.conftest import blob
from tests.integration.pod_main import Info, du, fetcher, wait_for

from fastload.cache import CachedShard, ShardCache

SIZE = 96 * 1024
SHARDS = [(f"shard-{i:06d}.tar", blob(500 + i, SIZE)) for i in range(6)]


def main(role: str, root: str, work_dir: str) -> None:
    work = Path(work_dir)
    report: dict[str, object] = {"pid": os.getpid(), "role": role}
    cache = ShardCache(root, room_wait_s=0.5)  # the cap is the one stored in the directory
    if role == "holder":
        held = [cache.open_shard("ds", Info(n, d), fetcher(work, n, d)) for n, d in SHARDS[:2]]
        (work / "pinned").write_text("1")
        wait_for(work / "reader-done")
        report["intact"] = [
            bytes(s.data) == d and s.path is not None and s.path.exists()
            for s, (_, d) in zip(held, SHARDS[:2], strict=True)
        ]
        for s in held:
            s.close()
    else:
        wait_for(work / "pinned")
        sizes, right, cached = [], [], []
        previous: CachedShard | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n, d in SHARDS[2:]:
                s = cache.open_shard("ds", Info(n, d), fetcher(work, n, d))
                right.append(bytes(s.data) == d)
                cached.append(s.path is not None)
                sizes.append(du(root))
                if previous is not None:
                    previous.close()
                previous = s
        assert previous is not None
        previous.close()
        assert cache.disk is not None
        st = cache.disk.counters()
        report.update(
            du=sizes,
            right=right,
            cached=cached,
            uncached_reads=st.uncached_reads,
            warnings=[str(w.message) for w in caught if w.category is RuntimeWarning],
        )
        (work / "reader-done").write_text("1")
    cache.close()
    (work / f"{role}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
