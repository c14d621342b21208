"""Resume at loader level over chains of world changes: every sample exactly once.

A *chain* is a run of links; each link is a job on some world (nodes x ranks per
node, DataLoader workers, persistent or not) with a fixed global batch, which
loads the state the previous link saved, consumes some steps on every rank in
lockstep, and saves the state again (every rank must report the same state). The
last link consumes the rest of the epoch. Over the whole chain, every sample of
the epoch must come out exactly once, apart from the pad that evens out the
ranks of the final step (at most world_size - 1 samples; none on one rank).

In-process chains (``num_workers=0``) run as many Hypothesis examples; a sample of
chains runs with real DataLoader worker processes, persistent or not. The two
reproductions of issue 12 are spelled out below the property tests.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload.datasets.streaming import StreamingDataset
from fastload.loader.dataloader import DataLoader
from fastload.sampling import World
from fastload.shards.writer import ShardWriter

N = 203  # not a multiple of anything below: every chain ends in a short step
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch", "fastload.datasets.streaming"])
GLOBAL_BATCH = 12
SEED = 5


@dataclass(frozen=True)
class Link:
    nodes: int
    ranks_per_node: int
    workers: int = 0
    persistent: bool = False
    share: float = 0.5  # of the steps left in the epoch (ignored by the last link)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def batch(self) -> int:
        return GLOBAL_BATCH // self.world_size


def write_ids(url: str, n: int = N) -> None:
    with ShardWriter(url, shard_size="8KB") as w:
        for i in range(n):
            w.write({"__key__": f"s{i:05d}", "cls": i})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("resume") / "ds")
    write_ids(url)
    return url


def make_loader(url: str, link: Link, slot: int, seed: int = SEED) -> DataLoader:
    world = World.of(slot, link.world_size, link.ranks_per_node)
    ds = StreamingDataset(url, seed=seed, world=world)
    return DataLoader(
        ds,
        batch_size=link.batch,
        num_workers=link.workers,
        persistent_workers=link.persistent,
        world=world,
        # the ranks of a link share this process (each rank is a process in a real
        # job): forking workers while another rank's loader threads run could copy a
        # held lock into the child, so workers come from a clean fork server
        multiprocessing_context=_CONTEXT if link.workers else None,
        plan_in_workers=bool(link.workers),  # raw batches: workers only when asked for
    )


def keys(batch: Any) -> list[str]:
    return list(batch["__key__"])


class Job:
    """One link: a loader per rank, consumed in lockstep."""

    def __init__(self, url: str, link: Link, seed: int = SEED) -> None:
        self.link = link
        self.loaders = [make_loader(url, link, slot, seed) for slot in range(link.world_size)]
        self.iters: list[Iterator[Any] | None] = [None] * link.world_size

    def load(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            for loader in self.loaders:
                loader.load_state_dict(state)
            self.iters = [None] * self.link.world_size

    def left(self) -> int:
        loader = self.loaders[0]
        return len(loader) - loader.batches_consumed

    def step(self, steps: int) -> list[str]:
        out: list[str] = []
        for _ in range(steps):
            for r, loader in enumerate(self.loaders):
                if self.iters[r] is None:
                    self.iters[r] = iter(loader)
                it = self.iters[r]
                assert it is not None
                out += keys(next(it))
        return out

    def finish(self) -> list[str]:
        out: list[str] = []
        for r, loader in enumerate(self.loaders):
            it = self.iters[r]
            for batch in it if it is not None else iter(loader):
                out += keys(batch)
        return out

    def state(self) -> dict[str, Any]:
        states = [loader.state_dict() for loader in self.loaders]
        for other in states[1:]:
            assert other == states[0], "ranks disagree on the state"
        return states[0]

    def close(self) -> None:
        self.iters = [None] * self.link.world_size
        for loader in self.loaders:
            loader.close()
            loader.dataset.close()  # the cache's prefetch threads of this process


def run_chain(url: str, links: list[Link]) -> tuple[list[str], Link]:
    """Every key the chain's ranks consumed, in order, and the link that ended the
    epoch."""
    consumed: list[str] = []
    state: dict[str, Any] | None = None
    last = links[0]
    for k, link in enumerate(links):
        if state is not None and state["epoch"] > 0:
            break  # an earlier link consumed the whole epoch
        last = link
        job = Job(url, link)
        try:
            job.load(state)
            if k == len(links) - 1:
                consumed += job.finish()
            else:
                consumed += job.step(int(job.left() * link.share))
                state = job.state()
        finally:
            job.close()
    return consumed, last


def assert_exactly_once(consumed: list[str], final: Link, n: int = N) -> None:
    counts = Counter(consumed)
    assert set(counts) == {f"s{i:05d}" for i in range(n)}, "samples lost"
    repeats = len(consumed) - n
    assert repeats < final.world_size, f"{repeats} samples repeated"
    if final.world_size == 1:
        assert repeats == 0


# worlds whose world_size divides the global batch of 12; each layout's node count
# divides it too, so any of them can resume any other mid-epoch
WORLDS = [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2), (1, 4), (4, 1), (2, 3), (3, 2), (6, 1)]


@st.composite
def chains(draw: st.DrawFn, workers: bool) -> list[Link]:
    n = draw(st.integers(1, 4))
    out = []
    for _ in range(n):
        nodes, rpn = draw(st.sampled_from(WORLDS))
        w = draw(st.integers(1, 2)) if workers else 0
        persistent = bool(w) and draw(st.booleans())
        share = draw(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
        out.append(Link(nodes, rpn, w, persistent, share))
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(links=chains(workers=False))
def test_in_process_chains_use_every_sample_once(dataset: str, links: list[Link]) -> None:
    assert_exactly_once(*run_chain(dataset, links))


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(links=chains(workers=True))
def test_chains_with_worker_processes_use_every_sample_once(
    dataset: str, links: list[Link]
) -> None:
    assert_exactly_once(*run_chain(dataset, links))


@pytest.mark.parametrize("persistent", [False, True])
def test_two_nodes_then_one_node_then_resume_with_workers(dataset: str, persistent: bool) -> None:
    # issue 12, bug 1: 2 nodes -> save -> 1 node -> save -> resume, with workers
    links = [
        Link(2, 1, workers=2, persistent=persistent, share=0.4),
        Link(1, 1, workers=2, persistent=persistent, share=0.5),
        Link(1, 1, workers=2, persistent=persistent),
    ]
    assert_exactly_once(*run_chain(dataset, links))


def test_saving_right_after_loading_keeps_the_layout(dataset: str) -> None:
    # a state saved before the loader iterates again carries the loaded layout
    first = Job(dataset, Link(2, 1, workers=2, share=0.4))
    consumed = first.step(5)
    state = first.state()
    first.close()
    second = Job(dataset, Link(1, 1, workers=2))
    second.load(state)
    again = second.state()  # nothing consumed in between
    second.close()
    assert again["dataset"]["canonical_nodes"] == 2
    for key in ("dataset", "epoch", "batches_consumed", "global_batch_size"):
        assert again[key] == state[key], key
    last = Job(dataset, Link(1, 1, workers=2))
    last.load(again)
    consumed += last.finish()
    last.close()
    assert_exactly_once(consumed, Link(1, 1))


@pytest.mark.parametrize("other_seed", [False, True])
def test_rollback_into_a_running_persistent_loader(dataset: str, other_seed: bool) -> None:
    # issue 12, bug 2: a state from another world (2 nodes: canonical_nodes 2) and maybe
    # another seed, loaded into a loader whose persistent workers already run an epoch
    seed = 9 if other_seed else SEED
    saver = Job(dataset, Link(2, 1), seed=seed)
    before = saver.step(4)
    state = saver.state()
    saver.close()
    running = Job(dataset, Link(1, 1, workers=2, persistent=True))
    running.step(6)  # its workers planned this epoch with one node and seed 5
    running.load(state)
    after = running.finish()
    running.close()
    assert_exactly_once(before + after, Link(1, 1))
    # and in the very order the uninterrupted 2-node job would have continued with
    # (same global batch, so the same global steps)
    whole = Job(dataset, Link(2, 1), seed=seed)
    reference = whole.step(4)
    reference_rest = whole.finish()
    whole.close()
    assert set(after) == set(reference_rest)
    assert reference == before


def test_one_rank_pads_nothing(dataset: str) -> None:
    loader = make_loader(dataset, Link(1, 1), 0)
    batches = [keys(b) for b in loader]
    loader.dataset.close()
    assert sum(len(b) for b in batches) == N
    assert [len(b) for b in batches] == [12] * (N // 12) + [N % 12]
    assert len(loader) == len(batches)


def test_ranks_pad_only_to_be_equal(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_ids(url, 203)
    link = Link(1, 4)  # 4 ranks x 3: 203 = 16 full steps of 12 + 11 -> 3 each, 1 repeat
    loaders = [make_loader(url, link, r) for r in range(4)]
    per_rank = [[k for b in loader for k in keys(b)] for loader in loaders]
    for loader in loaders:
        loader.dataset.close()
    assert {len(p) for p in per_rank} == {16 * 3 + 3}
    assert_exactly_once([k for p in per_rank for k in p], link)
    assert len([k for p in per_rank for k in p]) == 204
