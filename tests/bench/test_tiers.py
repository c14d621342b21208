"""The tier measurements and the report helpers on in-process inputs (no storage)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from typing import Any

import pytest

from fastload.bench.machine import disk_info, machine_info
from fastload.bench.report import REQUIRED_KEYS, figures_problems, render_table
from fastload.bench.runner import BenchSettings, select_shards
from fastload.bench.tiers import (
    DelayedDecoder,
    TierResult,
    cache_epoch,
    decode_rate,
    ram_replay,
    remote_ceiling,
)
from fastload.errors import ConfigError
from fastload.shards.manifest import Manifest, ShardInfo


def test_tier_result_rates() -> None:
    r = TierResult(samples=50, bytes=4_000_000, seconds=2.0, extra={"x": 1})
    assert r.samples_per_s == 25.0
    assert r.mb_per_s == 2.0
    assert r.to_dict()["x"] == 1
    assert TierResult(0, 0, 0.0).samples_per_s == 0.0


def test_remote_ceiling_reads_every_byte_in_parallel_ranges() -> None:
    data = bytes(range(256)) * 4000  # 1,024,000 bytes
    seen: list[tuple[int, int]] = []
    threads: set[int] = set()
    lock = threading.Lock()

    def read_range(a: int, b: int) -> bytes:
        with lock:
            seen.append((a, b))
            threads.add(threading.get_ident())
        return data[a:b]

    r = remote_ceiling(
        read_range, len(data), threads=4, part_size=256 << 10, min_seconds=0.0, max_passes=1
    )
    assert r.bytes == len(data)
    assert r.extra["passes"] == 1
    warmups = [span for span in seen if span == (0, 1)]
    assert len(warmups) == 4  # one untimed tiny GET per thread
    timed = [span for span in seen if span != (0, 1)]
    assert r.extra["requests"] == len(timed) == 4  # 1,024,000 / 262,144 -> 4 parts
    covered = sorted(timed)
    assert covered[0][0] == 0
    assert covered[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))


def test_cache_epoch_counts_bytes_keeps_samples_and_diffs_counters() -> None:
    samples = [{"__key__": str(i), "jpg": b"x" * 100, "json": b"{}"} for i in range(10)]
    counters = {"remote_bytes": 5}

    def stream() -> Any:
        for s in samples:
            counters["remote_bytes"] += 100
            yield s

    kept: list[dict[str, Any]] = []
    r = cache_epoch(stream(), lambda: dict(counters), keep=kept, keep_bytes=510)
    assert (r.samples, r.bytes) == (10, 1020)
    assert r.extra["remote_bytes"] == 1000
    assert len(kept) == 5  # 5 x 102 bytes fit in 510


def test_ram_replay_and_decode_rate() -> None:
    samples = [{"__key__": "a", "jpg": b"12345"}]
    r = ram_replay(samples, min_seconds=0.01)
    assert r.samples >= 1
    assert r.bytes == 5 * r.samples
    assert ram_replay([]).samples == 0

    calls: list[str] = []

    def dec(sample: dict[str, Any]) -> dict[str, Any]:
        calls.append(sample["__key__"])
        return {"jpg": bytearray(7)}

    d = decode_rate([("jpg", b"abc"), ("jpg", b"defg")], dec, min_seconds=0.0)
    assert d.samples == 2
    assert d.bytes == 7
    assert len(calls) == 2
    assert d.extra["output_bytes"] == 7


def test_delayed_decoder_wraps_and_pickles() -> None:
    import pickle

    dd = pickle.loads(pickle.dumps(DelayedDecoder(dict, 0.0)))
    assert dd({"a": 1}) == {"a": 1}


def _manifest(sizes: list[tuple[int, int]]) -> Manifest:
    shards = tuple(
        ShardInfo(
            f"shard-{i:06d}.tar",
            b,
            n,
            "xxh3_128:" + "0" * 32,
            f"shard-{i:06d}.tar.idx",
            10,
            "xxh3_128:" + "0" * 32,
        )
        for i, (n, b) in enumerate(sizes)
    )
    return Manifest(shards=shards, fields=("jpg", "json"), url="file:///x")


def test_select_shards_covers_max_samples_within_max_bytes() -> None:
    m = _manifest([(10, 1000), (10, 1000), (10, 1000), (10, 1000)])
    assert len(select_shards(m, 15, None).shards) == 2
    assert len(select_shards(m, 100, None).shards) == 4
    assert len(select_shards(m, 100, 2500).shards) == 2
    assert len(select_shards(m, 1, 10).shards) == 1  # always at least one shard
    assert select_shards(m, 15, None).shards[0].name == "shard-000000.tar"


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="decode"):
        BenchSettings("s3://b/x", decode="gpu")
    with pytest.raises(ConfigError, match="epochs"):
        BenchSettings("s3://b/x", epochs=0)
    d = BenchSettings("s3://b/x", storage_options={"secret": "hush"}).to_dict()
    assert "hush" not in str(d)
    assert d["fetch"]["concurrency"] >= 1


def test_machine_info_has_the_facts(tmp_path: Any) -> None:
    info = machine_info(tmp_path)
    assert info["cores"] >= 1
    assert info["ram_bytes"] > 0
    assert info["python"].count(".") == 2
    assert info["torch"]
    assert info["image_backend"]["library"].startswith("Pillow")
    assert info["disk"]["total_bytes"] > 0
    assert disk_info(tmp_path / "not" / "yet")["free_bytes"] > 0


def _tier(sps: float) -> dict[str, Any]:
    return {"samples": 10, "bytes": 1000, "seconds": 1.0, "samples_per_s": sps, "mb_per_s": 0.001}


def test_figures_problems_flags_missing_keys_and_bad_figures() -> None:
    good: dict[str, Any] = {k: {} for k in REQUIRED_KEYS}
    good.update(
        version=1,
        ram=_tier(5.0),
        disk=_tier(3.0),
        dataset={"url": "u"},
        decode={"measured": False, "reason": "--decode none"},
        bottleneck={"summary": "decode-bound: x", "advice": ["do y"]},
    )
    assert figures_problems(good) == []
    assert "missing key 'loader'" in figures_problems(
        {k: v for k, v in good.items() if k != "loader"}
    )
    bad = dict(good, ram=_tier(float("inf")))
    assert any("RAM replay" in p for p in figures_problems(bad))
    table = render_table(good)
    assert "bottleneck: decode-bound: x" in table
    assert "try: do y" in table
    assert "absent" in table  # no h2d, no decode


def test_replace_keeps_settings_frozen() -> None:
    s = BenchSettings("s3://b/x")
    assert replace(s, decode="none").decode == "none"
    assert s.decode == "pil"


def _jpegs(n: int) -> list[tuple[str, bytes]]:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)).save(buf, "JPEG")
        out.append(("jpg", buf.getvalue()))
    return out


@pytest.mark.dali
def test_dali_cpu_decode_rate() -> None:
    pytest.importorskip("nvidia.dali")
    from fastload.bench.tiers import dali_decode_rate

    r = dali_decode_rate(_jpegs(8), size=60, batch_size=4, min_seconds=0.0)
    assert r.samples >= 8
    assert r.extra["output_bytes"] == 60 * 80 * 3  # shorter side 60: 60x80 RGB


def test_pil_decode_rate_reports_decoded_size() -> None:
    from fastload.decode import Decoder

    r = decode_rate(_jpegs(4), Decoder(image="numpy", size=60), min_seconds=0.0)
    assert r.samples == 4
    assert r.extra["output_bytes"] == 60 * 80 * 3
