"""Hostile manifests and item catalogs, generated: traversal and absolute names,
symlinks planted in the dataset and the cache, control characters, absurd and
ill-typed counts and sizes. Whatever the input, reading it may fail only with a
:class:`FastloadError`; no file outside the dataset and cache directories is created,
changed or deleted; no pickle from the input is run; and the Python heap of the
reading process never grows by more than :data:`HEAP_BOUND` (the bound
``docs/security.md`` states)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sqlite3
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fastload.datasets.cached import cached
from fastload.datasets.sharded import ShardedDataset
from fastload.errors import FastloadError
from fastload.shards.writer import ShardWriter

from .conftest import Marker

#: The most the Python heap may grow while a hostile dataset is opened and read.
HEAP_BOUND = 64 * 2**20

_NAMES = [
    "../victim/a.txt",
    "a/../../victim/a.txt",
    "/etc/passwd",
    "VICTIM_ABS",
    ".",
    "..",
    "",
    "link.tar",
    "linkdir/a.txt",
    "x" * 300,
    "shard\x1b[2J.tar",
    "shard\x00.tar",
    "REAL",
    "REAL_INDEX",
]
_COUNTS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**31, 3 * 10**8, 2**62, 10**30]),
    st.integers(0, 2**40),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
_CHECKSUMS = st.one_of(
    st.sampled_from(["REAL", "REAL_INDEX"]),
    st.binary(min_size=16, max_size=16).map(lambda b: "xxh3_128:" + b.hex()),
    st.text(max_size=40),
)


def _names() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_NAMES), st.text(max_size=20))


@st.composite
def hostile_shard(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "name": draw(_names()),
        "bytes": draw(_COUNTS),
        "samples": draw(_COUNTS),
        "checksum": draw(_CHECKSUMS),
        "index": {
            "name": draw(_names()),
            "bytes": draw(_COUNTS),
            "checksum": draw(_CHECKSUMS),
        },
    }


@st.composite
def plausible_shard(draw: st.DrawFn) -> dict[str, Any]:
    """An entry that passes the manifest's checks, so reading goes on to the store,
    the cache and the index: symlinked names, other shards' objects, wrong sizes."""
    names = st.sampled_from(["link.tar", "linkdir/a.txt", "REAL", "REAL_INDEX", "x" * 300, "."])
    samples = draw(st.integers(0, 10**6))
    return {
        "name": draw(names),
        "bytes": samples * 512 + draw(st.integers(0, 2**40)),
        "samples": samples,
        "checksum": draw(st.sampled_from(["REAL", "REAL_INDEX", "xxh3_128:" + "ab" * 16])),
        "index": {
            "name": draw(names),
            "bytes": draw(st.integers(0, 2**40)),
            "checksum": draw(st.sampled_from(["REAL", "REAL_INDEX", "xxh3_128:" + "cd" * 16])),
        },
    }


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real one-shard dataset to copy: its directory and its shard entry."""
    url = tmp_path_factory.mktemp("honest") / "ds"
    with ShardWriter(str(url)) as w:
        for i in range(5):
            w.write({"__key__": f"s{i}", "bin": bytes([i]) * 100})
    doc = json.loads((url / "manifest.json").read_text())
    return {"dir": url, "shard": doc["shards"][0]}


def _snapshot(root: Path, skip: tuple[str, ...]) -> dict[str, Any]:
    """Every path under ``root`` except the ``skip`` top-level entries: type, size,
    mode, mtime and content digest (symlinks by target, never followed)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] in skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.relpath(p, root).split(os.sep)[0] in skip:
                continue
            s = os.lstat(p)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[p] = ("dir", s.st_mode)
            else:
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
                out[p] = ("file", s.st_size, s.st_mode, s.st_mtime_ns, digest)
    return out


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """The test's temp dir; each generated example makes its own world inside."""
    return tmp_path


def _world(base: Path) -> Path:
    """A fresh root holding ``victim/`` (files fastload must never touch) and the
    attacker's symlinks into it."""
    root = Path(tempfile.mkdtemp(dir=base))
    victim = root / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "a.txt").write_text("precious")
    (victim / "sub" / "authorized_keys").write_text("ssh-ed25519 AAAA me")
    return root


def _fill(doc_shards: list[dict[str, Any]], honest: dict[str, Any], root: Path) -> None:
    real = honest["shard"]
    for s in doc_shards:
        for holder in (s, s["index"]):
            if holder["name"] == "REAL":
                holder["name"] = real["name"]
            elif holder["name"] == "REAL_INDEX":
                holder["name"] = real["index"]["name"]
            elif holder["name"] == "VICTIM_ABS":
                holder["name"] = str(root / "victim" / "a.txt")
            if holder["checksum"] == "REAL":
                holder["checksum"] = real["checksum"]
            elif holder["checksum"] == "REAL_INDEX":
                holder["checksum"] = real["index"]["checksum"]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shards=st.lists(st.one_of(hostile_shard(), plausible_shard()), max_size=4),
    honest_first=st.booleans(),
    with_cache=st.booleans(),
)
def test_hostile_manifests(
    scratch: Path,
    honest: dict[str, Any],
    shards: list[dict[str, Any]],
    honest_first: bool,
    with_cache: bool,
) -> None:
    root = _world(scratch)
    ds_dir = root / "ds"
    shutil.copytree(honest["dir"], ds_dir)
    os.symlink(root / "victim" / "a.txt", ds_dir / "link.tar")
    os.symlink(root / "victim", ds_dir / "linkdir")
    doc_shards = ([dict(honest["shard"])] if honest_first else []) + shards
    _fill(doc_shards, honest, root)
    doc = {"format": "fastload", "version": 1, "shards": doc_shards, "fields": ["bin"]}
    (ds_dir / "manifest.json").write_text(json.dumps(doc))
    before = _snapshot(root, skip=("cache",))

    tracemalloc.start()
    try:
        ds = None
        try:
            ds = ShardedDataset(str(ds_dir), cache_dir=root / "cache" if with_cache else None)
            event("manifest accepted")
            for i in range(min(len(ds), 7)):
                sample = ds[i]
                assert set(sample) >= {"__key__"}
                event("a sample read")
        except FastloadError as exc:
            event(f"refused: {type(exc).__name__}")
        finally:
            if ds is not None:
                ds.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < HEAP_BOUND
    assert _snapshot(root, skip=("cache",)) == before
    assert sorted(os.listdir(root)) in (["cache", "ds", "victim"], ["ds", "victim"])
    shutil.rmtree(root)


class Honest:
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return {"i": i, "payload": bytes([i]) * 50}


_ROW_VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 512, 2**40]), st.text(max_size=8)
)


@st.composite
def hostile_row(draw: st.DrawFn) -> tuple[Any, ...]:
    return (
        draw(st.integers(-2, 8)),
        draw(st.one_of(_names(), st.sampled_from(["PLANTED", "SYMLINK"]))),
        draw(_ROW_VALUES),
        draw(_ROW_VALUES),
        draw(st.one_of(st.text(max_size=80), st.just("hmac-sha256:" + "0" * 64))),
    )


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(hostile_row(), max_size=6), links=st.integers(0, 3))
def test_hostile_item_catalogs(scratch: Path, rows: list[tuple[Any, ...]], links: int) -> None:
    root = _world(scratch)
    marker = root / "victim" / "code-ran"
    ds = cached(Honest(), cache_dir=root / "cache", key="fuzz")
    ds[0]  # a genuine catalog and shard to tamper with
    ds.close()
    planted = ds.root / f"items-{os.getpid() + 1}-00000.tar"
    payload = pickle.dumps(Marker(marker))
    planted.write_bytes(b"\0" * 512 + payload)
    for k in range(1, links + 1):  # names the next writer of this pid will try
        os.symlink(
            root / "victim" / "sub" / "new-file", ds.root / f"items-{os.getpid()}-{k:05d}.tar"
        )
    with sqlite3.connect(ds.root / "catalog.sqlite") as db:
        for i, shard, offset, size, mac in rows:
            if shard == "PLANTED":
                shard, offset, size = planted.name, 512, len(payload)
            elif shard == "SYMLINK":
                shard = f"items-{os.getpid()}-00001.tar"
            elif shard == "VICTIM_ABS":
                shard = str(root / "victim" / "a.txt")
            db.execute(
                "INSERT OR REPLACE INTO items VALUES (?, ?, ?, ?, ?)", (i, shard, offset, size, mac)
            )
    before = _snapshot(root, skip=("cache",))

    tracemalloc.start()
    try:
        victim = cached(Honest(), cache_dir=root / "cache", key="fuzz")
        got = [victim[i] for i in range(len(victim))]
        again = [victim[i] for i in range(len(victim))]
        victim.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == again == [Honest()[i] for i in range(6)]
    assert not marker.exists()
    assert peak < HEAP_BOUND
    assert _snapshot(root, skip=("cache",)) == before
    shutil.rmtree(root)
