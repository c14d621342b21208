"""One cap over everything fastload writes under ``cache_dir``: raw shards, pixel
shards, ``ParquetTokenDataset``'s token directory and ``fastload.cached()`` items,
written by competing real processes over SeaweedFS, never take ``du`` of the cache
directory above the cap; ``fastload cache stats`` counts each kind right (against the
files on disk), ``clear`` removes each kind and ``verify`` finds a damaged entry of
each kind; what a reader holds is never evicted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fastload.cache import DiskTier
from fastload.cache.catalog import BLOCK
from fastload.cache.external import token_estimate
from fastload.shards.writer import ShardWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "text"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "datasets"))

from test_pixels import image_sample
from text_helpers import make_corpus, train_tokenizer
from text_helpers import write_parquet as write_docs

CHILD = Path(__file__).resolve().parent / "onecap_child.py"
KINDS = ("raw", "pixels", "tokens", "items")
STAT_KIND = {"raw": "shards", "pixels": "pixels", "tokens": "tokens", "items": "items"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    support = str(Path(__file__).resolve().parents[1] / "support" / "site")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (support, env.get("PYTHONPATH")) if p)
    return env


def _cli(cache: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    """``fastload cache <argv> --json`` in a process of its own."""
    p = subprocess.run(
        [sys.executable, "-m", "fastload", "cache", *argv, "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def _start(kind: str, cache: Path, spec: dict[str, Any], out: Path) -> subprocess.Popen[str]:
    spec_path = out.with_suffix(".spec")
    spec_path.write_text(json.dumps(spec))
    return subprocess.Popen(
        [sys.executable, str(CHILD), kind, str(cache), str(spec_path), str(out)],
        env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _du(path: Path) -> int:
    """``du -sB1``: the allocated bytes of everything under ``path``."""
    p = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True)
    return int(p.stdout.split()[0]) if p.stdout.strip() else 0


def _blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _files_of(cache: Path) -> dict[str, tuple[int, int]]:
    """(files, bytes the cap counts) of each kind, read off the disk."""
    out = {"shards": [0, 0], "pixels": [0, 0], "tokens": [0, 0], "items": [0, 0]}
    for p in (cache / "data").rglob("*"):
        if p.is_file():
            k = out["pixels" if ".px-" in p.name else "shards"]
            k[0] += 1
            k[1] += p.stat().st_size
    tokens = cache / "text" / "tokens"
    for d in tokens.iterdir() if tokens.exists() else []:
        if d.is_dir() and not d.name.startswith("."):
            out["tokens"][0] += 1
            out["tokens"][1] += BLOCK + sum(
                BLOCK if f.is_dir() else _blocks(f.stat().st_size) for f in d.rglob("*")
            )
    for f in (cache / "cached").rglob("items-*.tar") if (cache / "cached").exists() else []:
        out["items"][0] += 1
        out["items"][1] += _blocks(f.stat().st_size)
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.fixture
def sources(seaweed: Any, tmp_path: Path) -> dict[str, dict[str, Any]]:
    url, opts = seaweed.new_url("onecap"), seaweed.storage_options
    with ShardWriter(url, shard_size="60KB", storage_options=opts) as w:
        for i in range(30):
            w.write(image_sample(i))
    docs = make_corpus(400, seed=3)
    tok = tmp_path / "tokenizer.json"
    train_tokenizer(docs, str(tok))
    from fastload.text.tokenizer import eos_id_of, load_tokenizer

    eos = eos_id_of(load_tokenizer(str(tok)), None, str(tok))
    parquet = write_docs(str(tmp_path / "docs" / "part-0.parquet"), docs)
    key_file = tmp_path / "items.key"
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o600)
    images = {"url": url, "storage_options": opts, "size": 48}
    return {
        "raw": images,
        "pixels": images,
        "tokens": {"parquet": parquet, "tokenizer": str(tok), "docs": docs, "eos": eos},
        "items": {"n": 150, "key_file": str(key_file)},
    }


def _run(kinds: tuple[str, ...], cache: Path, sources: dict[str, Any], rounds: int,
         tmp: Path, cap: int | None = None) -> tuple[int, list[dict[str, Any]]]:  # fmt: skip
    """Run one child per kind at once; returns (peak du while they ran, their reports)."""
    outs = [tmp / f"{k}.{n}.{time.monotonic_ns()}.json" for n, k in enumerate(kinds)]
    procs = [
        _start(k, cache, {**sources[k], "rounds": rounds}, o)
        for k, o in zip(kinds, outs, strict=True)
    ]
    peak = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, _du(cache))
        if cap is not None:
            assert peak <= cap, f"du {peak} over the cap {cap}"
        time.sleep(0.05)
    peak = max(peak, _du(cache))
    reports = []
    for k, p, o in zip(kinds, procs, outs, strict=True):
        log = p.stdout.read() if p.stdout else ""
        assert p.wait() == 0, f"{k} child failed:\n{log[-3000:]}"
        reports.append(json.loads(o.read_text()))
    return peak, reports


def test_every_kind_shares_one_cap(sources: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # 1. each kind once, no cap: stats per kind equal what is on disk
    _, reports = _run(KINDS, cache, sources, 1, tmp_path)
    assert all(r["samples"] > 0 and not r["mismatches"] for r in reports), reports
    rc, stats = _cli(cache, "stats")
    assert rc == 0
    on_disk = _files_of(cache)
    for kind in KINDS:
        k = STAT_KIND[kind]
        assert stats["kinds"][k]["entries"] == on_disk[k][0] > 0, (k, stats["kinds"], on_disk)
        got = stats["kinds"][k]["bytes"]
        if k in ("tokens", "items"):
            assert got == on_disk[k][1], (k, stats["kinds"], on_disk)
        else:
            assert got == on_disk[k][1], (k, stats["kinds"], on_disk)
    assert stats["kinds"]["metadata"]["bytes"] > 0
    # what the cap counts is what du finds (nothing under cache_dir is outside it)
    assert stats["disk_bytes"] >= _du(cache) - 64 * 1024, (stats["disk_bytes"], _du(cache))
    data = sum(stats["kinds"][STAT_KIND[k]]["bytes"] for k in KINDS)
    print("kinds:", stats["kinds"], "parquet", os.path.getsize(sources["tokens"]["parquet"]))

    # 2. clear removes every kind (nobody holds anything now)
    rc, cleared = _cli(cache, "clear")
    assert rc == 0
    for kind in KINDS:
        k = STAT_KIND[kind]
        assert cleared["kinds"][k]["removed"] == on_disk[k][0], cleared["kinds"]
        assert cleared["kinds"][k]["left"] == 0
    assert all(n == 0 for n, _ in _files_of(cache).values()), _files_of(cache)

    # 3. a cap that fits about half of it all, the tokens' reservation included: four
    # processes compete for three rounds; du never above the cap, every byte right
    tier = DiskTier(cache, sweep=False)
    floor = tier.metadata_bytes(least=True)
    estimate = token_estimate(os.path.getsize(sources["tokens"]["parquet"]), 2)
    cap = floor + 256 * 1024 + max(data // 2, estimate)
    tier.set_limit(cap)
    tier.close()
    peak, reports = _run(KINDS, cache, sources, 3, tmp_path, cap=cap)
    assert all(r["samples"] > 0 and not r["mismatches"] for r in reports), reports
    assert peak <= cap
    rc, stats = _cli(cache, "stats")
    assert stats["disk_bytes"] <= cap
    counters = stats["counters"]
    assert counters.get("evictions", 0) > 0  # they did compete
    print(f"one cap: peak du {peak} of cap {cap} bytes ({data} bytes of data in all)")


def test_verify_finds_a_damaged_entry_of_each_kind(sources: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _run(KINDS, cache, sources, 1, tmp_path)
    rc, report = _cli(cache, "verify")
    assert rc == 0, report
    assert set(report["checked_kinds"]) == {"shards", "pixels", "tokens", "items"}
    # one byte flipped in one file of each kind
    victims = [
        next(p for p in (cache / "data").rglob("*.tar") if ".px-" not in p.name),
        next(p for p in (cache / "data").rglob("*") if ".px-" in p.name),
        next(p for p in (cache / "text" / "tokens").rglob("*") if p.is_file()
             and p.suffix != ".json" and not p.name.endswith(".lock")),
        next((cache / "cached").rglob("items-*.tar")),
    ]  # fmt: skip
    for p in victims:
        os.chmod(p, 0o600)
        with open(p, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
    rc, report = _cli(cache, "verify")
    assert rc == 1
    kinds = {b["kind"] for b in report["bad"]}
    assert kinds == {"shards", "pixels", "tokens", "items"}, report["bad"]
    # repaired: dropped, and each kind is made again right
    rc, _ = _cli(cache, "verify", "--repair")
    _, reports = _run(KINDS, cache, sources, 1, tmp_path)
    assert all(not r["mismatches"] for r in reports), reports
    rc, report = _cli(cache, "verify")
    assert rc == 0, report["bad"]


def test_a_held_token_directory_and_item_shard_are_never_evicted(
    sources: dict[str, Any], tmp_path: Path
) -> None:
    import fastload
    from fastload import ParquetTokenDataset
    from fastload.sampling import World

    from .onecap_child import Items, item_ref

    cache = tmp_path / "cache"
    spec = sources["tokens"]
    tds = ParquetTokenDataset(spec["parquet"], tokenizer=spec["tokenizer"], seq_len=32,
                              cache_dir=cache, world=World.single(), shuffle=False)  # fmt: skip
    items = fastload.cached(Items(80), cache_dir=cache, key="held", shard_size="64KB",
                            key_file=sources["items"]["key_file"])  # fmt: skip
    assert [items[i] for i in range(80)] == [item_ref(i) for i in range(80)]
    items.close()  # sealed
    assert items[0] == item_ref(0)  # a hit: its shard is held open (pinned) again
    windows = [x["input_ids"].tolist() for x in tds]
    # another process clears the cache: what these readers hold stays, and reads right
    rc, cleared = _cli(cache, "clear")
    assert rc == 0
    assert cleared["kinds"]["tokens"]["left"] == 1
    assert cleared["kinds"]["items"]["left"] >= 1
    assert [x["input_ids"].tolist() for x in tds] == windows
    assert items[0] == item_ref(0)
    # released, they go
    items.close()
    del tds
    rc, cleared = _cli(cache, "clear")
    assert cleared["kinds"]["tokens"]["removed"] == 1
    assert cleared["kinds"]["tokens"]["left"] == 0
    assert cleared["kinds"]["items"]["left"] == 0
    assert not list((cache / "text" / "tokens").glob("[0-9a-f]*/"))
    assert not list((cache / "cached").rglob("items-*.tar"))


def test_processes_asking_for_the_same_tokens_at_once_share_one_entry(
    sources: dict[str, Any], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    _, reports = _run(("tokens",) * 3, cache, sources, 1, tmp_path)
    assert all(r["samples"] > 0 and not r["mismatches"] for r in reports), reports
    rc, stats = _cli(cache, "stats")
    assert stats["kinds"]["tokens"]["entries"] == 1
    assert stats["kinds"]["tokens"]["in_flight"] == 0
    assert stats["kinds"]["tokens"]["bytes"] == _files_of(cache)["tokens"][1]
    assert stats["counters"]["tokens_sealed"] == 1
    rc, report = _cli(cache, "verify")
    assert rc == 0, report
