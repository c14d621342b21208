"""How a :class:`~fastload.DataLoader` moves its batches, decided once, up front.

:func:`plan_transport` is a pure function of the loader's arguments and the
dataset's kind: it returns a :class:`TransportPlan` that says who builds the batches
(the loader's process from the node-local cache, the loader's process from token
shards, or torch's worker processes), how many worker processes start, which collate
runs, who pins, whether the workers share a tier, and why. The loader checks its
arguments (:func:`check_arguments`), makes the plan, then builds from it; its
:attr:`~fastload.DataLoader.transport_plan` keeps the plan for inspection.

The rules (the measurements behind them are in the comments and docs/benchmarks.md):

* a ``TokenDataset`` with the default collate (or ``collate_packed``) and a transport
  other than ``"pickle"``: whole batches of windows sliced in the loader's process
  (:mod:`fastload.loader.token_batches`), no worker process unless
  ``plan_in_workers=True``;
* ``transport="auto"``: fastload's own datasets (``ShardedDataset``,
  ``StreamingDataset``) without a ``transform`` and with no decoding, ``"nvjpeg"``
  decoding, or no workers to decode in, go through the cache transport
  (:mod:`fastload.loader.transport`); built-in CPU decoding with workers stays in the
  workers (stacked channels-last by :func:`~fastload.loader.transport.collate_decoded`);
  everything else is torch's path;
* a ``ShardedDataset`` with the pixel tier, decoding to an exact size, with no
  ``transform``, ``collate_fn`` or caller's sampler and ``transport="auto"``: an
  epoch whose every sample is stored is built in the loader's process
  (``pixel_batches``, :mod:`fastload.loader.pixel_batches`), the others through the
  workers;
* in the cache transport, raw batches are planned and built in the loader's process
  (``num_workers`` starts no process) unless ``plan_in_workers=True``; worker
  processes over a dataset without ``cache_dir`` share a tier the loader makes
  (:mod:`fastload.loader.shared_tier`);
* a ``ParquetTokenDataset(stream=True)`` whose first pass still runs: its reason says
  whether the batches stream the first pass or wait for it
  (:func:`~fastload.loader.token_batches.first_pass_note`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.utils.data

from fastload.datasets.options import NvjpegDecode
from fastload.errors import ConfigError
from fastload.loader.pixel_batches import pixel_batch_refusal
from fastload.loader.samplers import check_sampler_arguments
from fastload.loader.token_batches import builds_token_batches, first_pass_note

__all__ = [
    "BATCHES",
    "COLLATES",
    "TRANSPORTS",
    "BatchTransportDataset",
    "TransportPlan",
    "builds_items",
    "cache_able",
    "check_arguments",
    "choose_transport",
    "loader_decoder",
    "plan_transport",
    "torch_arguments",
]

TRANSPORTS = ("auto", "cache", "pickle")

# torch arguments the wrapper takes by name only (its own keyword arguments)
_OWNED_TORCH_ARGS = ("sampler", "batch_sampler", "shuffle", "dataset")


@runtime_checkable
class BatchTransportDataset(Protocol):
    """A map-style dataset whose items the cache transport can build from raw samples
    (what fastload's drop-ins ``CocoDetection``, ``Cityscapes`` and ``ImageFolder``
    implement; any dataset may).

    ``batch_transport``: true. ``source``: the
    :class:`~fastload.datasets.source.ShardSource` its samples come from, sample ``i``
    of the dataset being ``source.read(i)`` (``{"__key__": str, field: bytes}``).
    ``build_item(sample)``: turns that raw sample into exactly what ``dataset[i]``
    returns (decoding, targets, transforms). Under ``transport="cache"`` only the raw
    bytes move (as for ``ShardedDataset``: workers send where they are in the
    node-local cache) and ``build_item`` runs where the batch is built, in the
    loader's decode threads; the batch is the ``collate_fn`` (default: fastload's
    ``default_collate``) of the built items, as torch's path would give it.
    ``transport="auto"`` keeps such a dataset on torch's path, as it keeps built-in CPU
    decoding with workers: a ``build_item`` may run any Python (transforms) that
    would hold the GIL in the loader's threads; ``transport="cache"`` asks for them.
    """

    batch_transport: bool
    source: Any

    def __len__(self) -> int: ...

    def build_item(self, sample: Mapping[str, Any]) -> Any: ...


def _declares(obj: Any, name: str) -> bool:
    # on the object or its class, not forwarded by a __getattr__: torchvision's
    # wrap_dataset_for_transforms_v2 forwards every attribute to the dataset it wraps,
    # whose raw items are not the wrapper's
    if name in getattr(obj, "__dict__", {}):
        return True
    return any(name in vars(cls) for cls in type(obj).__mro__)


def cache_able(dataset: Any) -> bool:
    """Whether ``dataset`` declares ``batch_transport`` true and a ``source`` itself
    (a fastload dataset, or a :class:`BatchTransportDataset`), not through a wrapper
    that forwards attributes."""
    return (
        _declares(dataset, "batch_transport")
        and _declares(dataset, "source")
        and bool(getattr(dataset, "batch_transport", False))
    )


def builds_items(dataset: Any) -> bool:
    """Whether ``dataset`` follows :class:`BatchTransportDataset` (declared on the
    dataset itself: see :func:`cache_able`)."""
    return (
        cache_able(dataset)
        and _declares(dataset, "build_item")
        and callable(getattr(dataset, "build_item", None))
    )


#: Who builds the batches: the loader's process from token shards, the loader's process
#: from the node-local cache (workers, if any, send ``SampleRef`` records), or torch's
#: worker processes (or torch in this process without workers).
BATCHES = ("tokens", "refs", "workers")
#: Which collate torch's loader runs: the batch transport's ``collate_refs``,
#: ``collate_decoded`` (channels-last in the workers), fastload's ``default_collate``,
#: or the caller's ``collate_fn``.
COLLATES = ("refs", "decoded", "default", "given")


@dataclass(frozen=True)
class TransportPlan:
    """Which transport, batching and worker setup a loader runs, and why.

    ``transport``: ``"cache"`` or ``"pickle"`` (what ``DataLoader.transport`` reads).
    ``batches``: who builds them (one of :data:`BATCHES`). ``worker_processes``:
    processes torch starts per iteration. ``collate``: one of :data:`COLLATES`.
    ``nvjpeg``: JPEG fields packed raw and decoded whole on the loader's device.
    ``builder_decodes``: the loader's decode threads decode (or ``transform``).
    ``shared_tier``: the workers read through a tier the loader makes.
    ``pin_memory``: batches are staged through pinned memory, by torch's pin thread
    (``torch_pins``), the loader's own pool (``stage``) or allocated pinned where they
    are built (``pinned_batches``). ``persistent_workers``: as torch's. ``reasons``:
    one line per decision. ``pixel_batches``: an epoch whose every sample is in the
    dataset's pixel tier is built in the loader's process, with no worker process
    (:mod:`fastload.loader.pixel_batches`); the others go through ``batches``.
    """

    transport: str
    batches: str
    worker_processes: int
    collate: str
    nvjpeg: bool
    builder_decodes: bool
    shared_tier: bool
    pin_memory: bool
    torch_pins: bool
    stage: bool
    pinned_batches: bool
    persistent_workers: bool
    reasons: tuple[str, ...]
    pixel_batches: bool = False

    @property
    def why(self) -> str:
        """The reasons as one paragraph."""
        return "; ".join(self.reasons)


def check_arguments(
    dataset: Any,
    *,
    batch_size: Any,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    num_workers: int,
    transport: str,
    decode_threads: int | None,
    torch_kwargs: Mapping[str, Any],
) -> None:
    """Raise :class:`ConfigError` for what :class:`~fastload.DataLoader` refuses:
    what torch refuses of ``sampler``/``batch_sampler``
    (:func:`~fastload.loader.samplers.check_sampler_arguments`), torch's ``shuffle``
    and ``dataset`` as keywords, ``in_order=False``, bad sizes, an unknown transport,
    and ``shuffle`` with an iterable dataset."""
    check_sampler_arguments(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        sampler=sampler,
        batch_sampler=batch_sampler,
        drop_last=drop_last,
    )
    for name in _OWNED_TORCH_ARGS:
        if name in torch_kwargs:
            raise ConfigError(
                f"fastload.DataLoader: '{name}' is decided by the loader (it keeps the "
                "order resumable); use shuffle=, seed= and world= instead"
            )
    if torch_kwargs.get("in_order", True) is False:
        raise ConfigError("fastload.DataLoader: in_order=False would make resume inexact")
    if batch_sampler is None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"fastload.DataLoader: batch_size must be >= 1, got {batch_size!r}")
    if num_workers < 0:
        raise ConfigError(f"fastload.DataLoader: num_workers must be >= 0, got {num_workers}")
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"fastload.DataLoader: transport must be one of {TRANSPORTS}, got {transport!r}"
        )
    if decode_threads is not None and decode_threads < 1:
        raise ConfigError(f"fastload.DataLoader: decode_threads must be >= 1, got {decode_threads}")
    if isinstance(dataset, torch.utils.data.IterableDataset) and shuffle:
        raise ConfigError(
            "fastload.DataLoader: an iterable dataset orders itself; set shuffling on the "
            "dataset (e.g. StreamingDataset(shuffle=True)), not on the loader"
        )


def _builtin_decoder(decoder: Any) -> bool:
    from fastload.decode import Decoder

    return decoder is None or isinstance(decoder, (Decoder, NvjpegDecode))


def _cpu_decoder(decoder: Any) -> bool:
    from fastload.decode import Decoder

    return isinstance(decoder, Decoder) and decoder.image is not None


def loader_decoder(dataset: Any) -> Any:
    """What the cache transport's decode threads run on each sample: the dataset's
    ``build_item`` (:class:`BatchTransportDataset`), else its decoder followed by its
    ``transform`` if it has one."""
    if builds_items(dataset):
        return dataset.build_item
    decoder = getattr(dataset, "decoder", None)
    transform = getattr(dataset, "transform", None)
    if transform is None:
        return decoder
    from fastload.datasets.options import finish

    return functools.partial(finish, decoder=decoder, transform=transform)


def choose_transport(dataset: Any, asked: str, num_workers: int = 0) -> tuple[str, str]:
    """``("cache" or "pickle", why)``: see :class:`~fastload.DataLoader`'s
    ``transport``. Raises :class:`ConfigError` for ``"cache"`` over a dataset that
    makes its own items."""
    able = cache_able(dataset)
    if asked == "pickle":
        return "pickle", "transport='pickle' asked: torch's workers build and pickle batches"
    if asked == "cache":
        if not able:
            raise ConfigError(
                f"fastload.DataLoader: transport='cache' needs a fastload ShardedDataset or "
                f"StreamingDataset (items made from shards) or a dataset following "
                f"fastload.loader.BatchTransportDataset (batch_transport, source, "
                f"build_item); {type(dataset).__name__} makes its own items: use "
                "transport='pickle'"
            )
        return "cache", "transport='cache' asked: batches built from the node-local cache"
    if builds_items(dataset):
        return "pickle", (
            f"{type(dataset).__name__} builds its items on the CPU (build_item): in "
            "torch's workers; transport='cache' builds them in the loader's threads"
        )
    decoder = getattr(dataset, "decoder", None)
    simple = getattr(dataset, "transform", None) is None and _builtin_decoder(decoder)
    if simple and num_workers > 0 and _cpu_decoder(decoder):
        # measured (benchmarks/bench_transport.py --only decode): decoding in worker
        # processes beat the loader's decode threads (0.89x paired, 0.96x per CPU
        # second for threads): the Python around each Pillow call holds the GIL
        return "pickle", "built-in CPU decoding with workers: it stays in the workers"
    if not able:
        return "pickle", f"{type(dataset).__name__} makes its own items: torch's path"
    if not simple:
        return "pickle", "the dataset has a transform or its own decoder: torch's path"
    return "cache", "a fastload dataset without CPU decoding: batches built from the cache"


def plan_transport(
    dataset: Any,
    *,
    transport: str,
    num_workers: int,
    collate_fn: Callable[..., Any] | None,
    plan_in_workers: bool | None,
    device: torch.device | None,
    pin_memory: bool | None,
    persistent_workers: bool,
    source_lent: bool = False,
    caller_order: bool = False,
) -> TransportPlan:
    """The :class:`TransportPlan` for a loader over ``dataset`` with these (checked)
    arguments. ``source_lent``: the dataset's source reads from an earlier loader's
    shared tier (:func:`fastload.loader.shared_tier.is_lent`). ``caller_order``: a
    ``sampler`` or ``batch_sampler`` was given (torch's loader must iterate it: no
    token batcher, which orders itself). Raises
    :class:`ConfigError` for ``transport="cache"`` over a dataset that cannot."""
    is_cuda = device is not None and device.type == "cuda"
    pin = is_cuda if pin_memory is None else bool(pin_memory)
    # With workers, torch's pin-memory thread pins off the main thread and its
    # caching host allocator recycles pinned blocks safely; without workers torch
    # would pin synchronously anyway, so the loader's own bounded pool stages
    # (see docs/loader-sync.md).
    torch_pins = pin and (device is None or (is_cuda and num_workers > 0))
    stage = pin and not torch_pins
    procs, collate, nvjpeg, decodes, shared = num_workers, "given", False, False, False
    pinned = False  # batches built in this process are allocated pinned (feeding CUDA)
    pixels = False  # epochs of stored pixels built in this process
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    reasons: list[str] = []
    if not caller_order and builds_token_batches(dataset, transport, collate_fn, plan_in_workers):
        # TokenDataset windows, default collate: whole batches sliced from the mapped
        # shards in this process, no worker process (loader/token_batches.py)
        name, batches, procs = "cache", "tokens", 0
        pinned = bool(pin and is_cuda and torch.cuda.is_available())
        torch_pins, stage = False, pin and not pinned
        reasons.append(
            "a TokenDataset with the default collate: batches of windows sliced from the "
            "mapped shards in this process, no worker process"
        )
    else:
        name, why = choose_transport(dataset, transport, num_workers)
        reasons.append(why)
        batches = "refs" if name == "cache" else "workers"
    if batches == "refs":
        decoder = loader_decoder(dataset)
        if isinstance(decoder, NvjpegDecode) and collate_fn is None:
            # raw JPEG bytes packed (pinned), decoded whole on the loader's device
            nvjpeg, decoder = True, None
            reasons.append("nvjpeg decoding: JPEG bytes packed, decoded whole on the device")
        decodes = decoder is not None
        if plan_in_workers is False or (plan_in_workers is None and decoder is None):
            # raw batches: planning costs ~20 us a sample and the copy happens here
            # anyway, so worker processes only add start-up and contention
            # (measured: 0 workers 1.7x 2 workers on 2 cores, docs/benchmarks.md)
            procs = 0
            if num_workers:
                reasons.append(
                    f"batches planned and built by this process's threads: "
                    f"num_workers={num_workers} starts no process (plan_in_workers=True does)"
                )
        # one RAM-backed tier for the loader's processes (see shared_tier); a dataset
        # an earlier loader lent its tier to gets this loader's own
        shared = procs > 0 and (dataset.source.cache_dir is None or source_lent)
        if shared:
            reasons.append("workers over a dataset without cache_dir share a tier in RAM")
        # the batches are built here, already pinned when feeding CUDA
        pinned = bool(pin and is_cuda and torch.cuda.is_available())
        torch_pins, stage, collate = False, pin and not pinned, "refs"
    note = first_pass_note(dataset, tokens=batches == "tokens")
    if note is not None:
        reasons.append(note)
    if batches == "workers":
        if getattr(dataset, "pixels", None) is not None and not iterable:
            refusal = pixel_batch_refusal(
                dataset, transport=transport, collate_fn=collate_fn, caller_order=caller_order
            )
            pixels = refusal is None
            reasons.append(
                "pixel tier: an epoch whose every sample is stored is built from the mapped "
                "pixel shards in this process (no worker process); the others go through "
                "the workers, which fill it"
                if pixels
                else f"pixel tier: every epoch goes through the workers ({refusal})"
            )
        if collate_fn is None and _cpu_decoder(getattr(dataset, "decoder", None)):
            # decoded in the workers: stacked channels-last there, in shared memory
            collate = "decoded"
        elif collate_fn is None:
            collate = "default"
    return TransportPlan(
        transport=name,
        batches=batches,
        worker_processes=procs,
        collate=collate,
        nvjpeg=nvjpeg,
        builder_decodes=decodes,
        shared_tier=shared,
        pin_memory=pin,
        torch_pins=torch_pins,
        stage=stage,
        pinned_batches=pinned,
        persistent_workers=persistent_workers and procs > 0,
        reasons=tuple(reasons),
        pixel_batches=pixels,
    )


def torch_arguments(
    plan: TransportPlan,
    num_workers: int,
    torch_kwargs: Mapping[str, Any],
    *,
    prefetch_factor: int | None,
    worker_init_fn: Callable[[int], None] | None,
    multiprocessing_context: Any,
    generator: Any,
) -> tuple[dict[str, Any], list[str]]:
    """The keywords for torch's loader beyond those the plan fixes, and the names of
    the worker settings given for processes the plan does not start (torch refuses
    them; the loader warns)."""
    kwargs: dict[str, Any] = dict(torch_kwargs)
    if prefetch_factor is not None:
        kwargs["prefetch_factor"] = prefetch_factor
    for name, value in (
        ("worker_init_fn", worker_init_fn),
        ("multiprocessing_context", multiprocessing_context),
        ("generator", generator),
    ):
        if value is not None:
            kwargs[name] = value
    unused: list[str] = []
    if plan.worker_processes == 0 and num_workers > 0:
        # settings of worker processes that are not started (torch refuses them)
        kwargs.pop("prefetch_factor", None)
        unused = [
            name
            for name in ("worker_init_fn", "multiprocessing_context")
            if kwargs.pop(name, None) is not None
        ]
    return kwargs, unused
