"""The transport choice as a plan: plan_transport is a pure function of the loader's
arguments and the dataset's kind, and the loader builds what its plan says."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import fastload
from fastload.errors import ConfigError
from fastload.loader.transport_plan import TransportPlan, plan_transport

from .doubles import RangeStream, SquaresDataset


class _Shards(torch.utils.data.Dataset[Any]):
    """Looks like a fastload map-style dataset to the planner (items made from shards)."""

    batch_transport = True
    decoder = None
    transform = None

    def __init__(self, cache_dir: str | None = None) -> None:
        self.source = SimpleNamespace(cache_dir=cache_dir)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return i


def _plan(dataset: Any, **kw: Any) -> TransportPlan:
    args: dict[str, Any] = {
        "transport": "auto",
        "num_workers": 0,
        "collate_fn": None,
        "plan_in_workers": None,
        "device": None,
        "pin_memory": None,
        "persistent_workers": False,
    }
    return plan_transport(dataset, **{**args, **kw})


def test_a_dataset_that_makes_its_own_items_goes_through_torchs_workers() -> None:
    plan = _plan(SquaresDataset(8), num_workers=2, persistent_workers=True)
    assert (plan.transport, plan.batches, plan.worker_processes) == ("pickle", "workers", 2)
    assert (plan.collate, plan.persistent_workers, plan.shared_tier) == ("default", True, False)
    assert "makes its own items" in plan.why
    assert _plan(SquaresDataset(8), collate_fn=list).collate == "given"
    with pytest.raises(ConfigError, match="transport='cache' needs a fastload ShardedDataset"):
        _plan(SquaresDataset(8), transport="cache")


def test_raw_shard_batches_are_built_here_and_start_no_worker_process() -> None:
    plan = _plan(_Shards(), num_workers=2, persistent_workers=True)
    assert (plan.transport, plan.batches, plan.worker_processes) == ("cache", "refs", 0)
    assert (plan.collate, plan.persistent_workers, plan.shared_tier) == ("refs", False, False)
    assert "num_workers=2 starts no process" in plan.why
    pickled = _plan(_Shards(), transport="pickle", num_workers=2)
    assert (pickled.transport, pickled.worker_processes) == ("pickle", 2)


@pytest.mark.parametrize(
    ("cache_dir", "lent", "shared"),
    [(None, False, True), ("/cache", False, False), ("/cache", True, True)],
)
def test_workers_share_a_tier_without_a_cache_dir_of_their_own(
    cache_dir: str | None, lent: bool, shared: bool
) -> None:
    plan = _plan(_Shards(cache_dir), num_workers=2, plan_in_workers=True, source_lent=lent)
    assert (plan.batches, plan.worker_processes, plan.shared_tier) == ("refs", 2, shared)


def test_pinning() -> None:
    cpu = _plan(SquaresDataset(8), device=torch.device("cpu"))
    assert (cpu.pin_memory, cpu.torch_pins, cpu.stage) == (False, False, False)
    host = _plan(SquaresDataset(8), pin_memory=True)
    assert (host.pin_memory, host.torch_pins, host.stage) == (True, True, False)
    built = _plan(_Shards(), pin_memory=True)  # built here: torch's pin thread stays off
    assert (built.torch_pins, built.stage, built.pinned_batches) == (False, True, False)


def test_the_plan_is_a_frozen_value_and_the_loader_keeps_it() -> None:
    plan = _plan(SquaresDataset(8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.worker_processes = 3  # type: ignore[misc]
    loader = fastload.DataLoader(SquaresDataset(8), batch_size=2)
    assert loader.transport_plan == plan
    assert (loader.transport, loader.worker_processes) == (plan.transport, 0)
    stream = fastload.DataLoader(RangeStream(8), batch_size=2, num_workers=1)
    assert stream.transport_plan.batches == "workers"
    assert stream.worker_processes == 1


class _Items(_Shards):
    """Builds its own items from raw samples (BatchTransportDataset)."""

    def build_item(self, sample: Any) -> Any:
        return sample["__key__"]


class _Forwarding(torch.utils.data.Dataset[Any]):
    """Forwards every attribute it lacks to the dataset it wraps, as torchvision's
    ``wrap_dataset_for_transforms_v2`` does; its items are not the wrapped ones."""

    def __init__(self, inner: Any) -> None:
        self._dataset = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_dataset"], name)

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, i: int) -> Any:
        return ("wrapped", self._dataset[i])


def test_item_building_datasets_take_the_cache_transport_only_when_asked() -> None:
    plan = _plan(_Items(), num_workers=2)
    assert (plan.transport, plan.worker_processes) == ("pickle", 2)
    assert "build_item" in plan.why
    cache = _plan(_Items(), transport="cache", num_workers=2)
    assert (cache.transport, cache.batches, cache.builder_decodes) == ("cache", "refs", True)
    assert cache.worker_processes == 2  # the workers plan, the loader's threads build


def test_a_wrapper_that_forwards_attributes_stays_on_torchs_path() -> None:
    """Through the forwarded attributes a wrapper looks like the dataset it wraps; the
    cache transport would build the wrapped dataset's items, not the wrapper's."""
    for inner in (_Shards(), _Items()):
        wrapped = _Forwarding(inner)
        assert wrapped.batch_transport
        assert wrapped.source is inner.source  # forwarded
        assert _plan(wrapped).transport == "pickle"
        with pytest.raises(ConfigError, match="transport='cache' needs a fastload"):
            _plan(wrapped, transport="cache")
