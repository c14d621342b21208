"""fastload.dali's reader over a cache too small for the dataset: a clear
CacheFullError naming the shard and the fix (not an AssertionError), nothing left
pinned, and the external source still serves every sample under the same cap."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cache import DiskTier
from fastload.config import CacheConfig
from fastload.errors import CacheFullError

pytestmark = pytest.mark.dali
pytest.importorskip("nvidia.dali")  # the dali extra is part of the test install

N = 24


def _jpeg(i: int) -> bytes:
    img = np.full((32, 40, 3), (i * 9) % 256, np.uint8)
    img[:, : 4 + i % 30] = 255 - (i * 7) % 256
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.filterwarnings("ignore:fastload read shard:RuntimeWarning")
def test_reader_over_a_full_cache_raises_cache_full_naming_the_shard(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    with fastload.ShardWriter(url, shard_size="8KB") as w:
        for i in range(N):
            w.write({"__key__": f"img{i:04d}", "jpg": _jpeg(i), "cls": i})
    cache = tmp_path / "cache"
    probe = DiskTier(cache)
    floor = probe.bytes_used()  # the metadata the cap always counts
    probe.close()
    shards = sorted(p for p in Path(url).iterdir() if p.suffix == ".tar")
    assert len(shards) >= 4, shards
    # room for about two shards: the reader pins every shard, so a later one cannot fit
    cap = floor + 64 * 1024 + 2 * max(p.stat().st_size for p in shards)
    config = CacheConfig(cache_dir=str(cache), cache_limit=cap, room_wait_s=0.2)
    pipe = fastload.dali.pipeline(
        url, batch_size=4, source="reader", shuffle=False, size=16, cache_config=config
    )
    with pytest.raises(CacheFullError) as info:
        next(iter(pipe))
    msg = str(info.value)
    assert "source='reader'" in msg
    assert "cache_limit" in msg
    assert any(p.name in msg for p in shards)
    assert pipe._pinned == []  # every staged pin released
    pipe.close()

    # the same cap with the external source: every sample, read through RAM when full
    pipe = fastload.dali.pipeline(
        url, batch_size=4, shuffle=False, size=16, cache_config=config, drop_last=False
    )
    seen: list[int] = []
    for batch in pipe:
        seen.extend(batch["index"].tolist())
    pipe.close()
    assert sorted(seen) == list(range(N))
    tier = DiskTier(cache)
    assert tier.bytes_used() <= cap
    tier.close()
