"""fastload.DataLoader speaks torch's DataLoader interface (argument order, attributes)
and datasets speak torchdata's ``Stateful`` one: a ``StatefulDataLoader`` over a
``StreamingDataset`` resumes exactly."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

import fastload
from fastload.datasets.streaming import StreamingDataset
from fastload.errors import ConfigError
from fastload.loader.dataloader import DataLoader
from fastload.loader.sampler import ResumableSampler
from fastload.sampling import World
from fastload.shards.writer import ShardWriter
from support.resume import resume_halves

N = 203


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("torchapi") / "ds")
    with ShardWriter(url, shard_size="8KB") as w:
        for i in range(N):
            w.write({"__key__": f"s{i:05d}", "cls": i})
    return url


def key_list(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_positional_arguments_follow_torch() -> None:
    def positional(fn: Any) -> list[str]:
        return [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"
        ]

    torch_order = positional(torch.utils.data.DataLoader.__init__)
    assert positional(DataLoader.__init__) == torch_order
    assert torch_order[:4] == ["dataset", "batch_size", "shuffle", "sampler"]


def _init_fn(worker_id: int) -> None:
    pass


def test_attributes_are_torchs(dataset: str) -> None:
    ds = fastload.ShardedDataset(dataset)
    gen = torch.Generator()
    args: dict[str, Any] = dict(
        batch_size=7, num_workers=1, drop_last=True, timeout=30, worker_init_fn=_init_fn,
        generator=gen, prefetch_factor=3, persistent_workers=True, collate_fn=key_list,
    )  # fmt: skip
    ours = DataLoader(ds, world=World.single(), transport="pickle", **args)
    theirs: Any = torch.utils.data.DataLoader(ds, **args)
    for name in (
        "dataset", "batch_size", "drop_last", "num_workers", "timeout", "worker_init_fn",
        "generator", "prefetch_factor", "persistent_workers", "collate_fn", "pin_memory",
        "multiprocessing_context",
    ):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    assert isinstance(ours.sampler, ResumableSampler)
    assert isinstance(ours.batch_sampler, torch.utils.data.BatchSampler)
    assert ours.batch_sampler.sampler is ours.sampler
    assert ours.batch_sampler.batch_size == 7
    assert len(ours) == len(theirs) == N // 7
    # what a Lightning/Accelerate re-wrap reads off the loader to rebuild it
    assert next(iter(ours.batch_sampler)) == list(ours.sampler)[:7]


def test_a_sampler_or_batch_sampler_is_torchs(dataset: str) -> None:
    ds = fastload.ShardedDataset(dataset)
    batches = [[5, 1], [7, 3, 2]]
    for kw in ({"sampler": [5, 1, 7, 3, 2], "batch_size": 2}, {"batch_sampler": batches}):
        ours = DataLoader(ds, world=World.single(), collate_fn=key_list, **kw)
        theirs: Any = torch.utils.data.DataLoader(ds, collate_fn=key_list, **kw)
        assert list(ours) == list(theirs)
    with pytest.raises(ConfigError, match="mutually exclusive"):
        DataLoader(ds, batch_sampler=batches, shuffle=True)


def test_world_reaches_the_streaming_dataset(dataset: str) -> None:
    world = World.of(1, 2)
    ds = StreamingDataset(dataset)
    loader = DataLoader(ds, batch_size=4, world=world)
    assert ds.world == world
    mine = [k for b in loader for k in b["__key__"]]
    other = StreamingDataset(dataset, world=World.of(0, 2))
    theirs = [
        k for b in DataLoader(other, batch_size=4, world=World.of(0, 2)) for k in b["__key__"]
    ]
    assert len(mine) == len(theirs) == 102  # 203 over 2 ranks: one pad sample
    assert len(set(mine) & set(theirs)) == 1
    assert len(set(mine) | set(theirs)) == N
    ds.close()
    other.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_streaming_exactly(
    dataset: str, workers: int
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    made: list[StreamingDataset] = []

    def make() -> Any:
        ds = StreamingDataset(dataset, seed=3, world=World.single())
        made.append(ds)
        return StatefulDataLoader(ds, batch_size=8, num_workers=workers, collate_fn=key_list)

    full, head, rest = resume_halves(make, 9)
    assert sorted(k for b in full for k in b) == sorted(f"s{i:05d}" for i in range(N))
    assert head + rest == full
    for ds in made:
        ds.close()


def test_streaming_state_dict_round_trips(dataset: str) -> None:
    ds = StreamingDataset(dataset, seed=4, world=World.single())
    it = iter(ds)
    first = [next(it)["__key__"] for _ in range(10)]
    state = ds.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["yielded"] == 10
    again = StreamingDataset(dataset, seed=0, world=World.single())
    again.load_state_dict(state)
    assert again.seed == 4
    rest = [s["__key__"] for s in again]
    reference = StreamingDataset(dataset, seed=4, world=World.single())
    whole = [s["__key__"] for s in reference]
    reference.close()
    assert first + rest == whole
    with pytest.raises(ConfigError, match="not a StreamingDataset state"):
        again.load_state_dict({"kind": "other"})
    other = Path(dataset).parent / "other"
    with ShardWriter(str(other), shard_size="8KB") as w:
        for i in range(10):
            w.write({"__key__": f"s{i:05d}", "cls": i})
    with pytest.raises(ConfigError, match="203 samples"):
        StreamingDataset(str(other)).load_state_dict(state)
    ds.close()
    again.close()


def test_torchdata_stateful_dataloader_resumes_a_map_style_dataset(dataset: str) -> None:
    # map-style: torchdata's own stateful sampler carries the position
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = fastload.ShardedDataset(dataset)

    def make() -> Any:
        g = torch.Generator().manual_seed(1)
        return StatefulDataLoader(ds, batch_size=8, shuffle=True, generator=g, collate_fn=key_list)

    full, head, rest = resume_halves(make, 5)
    assert head + rest == full
    ds.close()
