"""DALI pipelines over fastload datasets, in two ways of feeding DALI.

``source="external"`` (default): a parallel ``fn.external_source`` in sample mode.
Its callback (pickled into DALI's Python workers) follows fastload's sampler (the
same epoch plan, :class:`~fastload.sampling.World` split and resume arithmetic as
:class:`~fastload.StreamingDataset`) and reads each sample's encoded image through
fastload's cache tiers; the pipeline decodes it.

``source="reader"``: DALI's own ``fn.readers.webdataset`` over shards already on the
node's NVMe cache (staged first when absent), with index files fastload writes from
its own index (no ``wds2idx`` scan). DALI then shuffles (its buffer) and splits by
``shard_id``/``num_shards`` itself; fastload maps each sample's ``source_info`` back
to its dataset index.

``device="gpu"`` decodes with nvJPEG (``fn.decoders.image(device="mixed")``) and
resizes on the GPU; ``device="cpu"`` runs the same graph on the CPU (what CI tests).
Batches are ``{"images": uint8 tensor (N, H, W, 3) (a list of per-image tensors when
``size`` is None), "index": int64 tensor of dataset sample indices}``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from fastload._args import keyword_only
from fastload.config import CacheConfig, FetchConfig
from fastload.datasets.source import ShardSource
from fastload.errors import CacheError, CacheFullError, ConfigError, MissingDependencyError
from fastload.sampling import SamplerState, World, epoch_steps, plan_from_state
from fastload.sampling.order import DEFAULT_WINDOW_SHARDS

__all__ = ["DaliPipeline", "default_device_id"]

_IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp", "leftImg8bit.png")
_READER = "fastload_reader"


def _dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as exc:
        raise MissingDependencyError("nvidia-dali-cuda120", "dali", "fastload.dali") from exc
    return dali


def default_device_id(
    local_rank: int, device_count: int, initialized: bool = False, current: int = 0
) -> int:
    """The GPU a rank's pipeline runs on when ``device_id`` is not given: the current
    CUDA device once the training script chose one (torch's CUDA is initialised, e.g.
    after ``torch.cuda.set_device``), else ``local_rank % device_count`` (right when
    ``CUDA_VISIBLE_DEVICES`` leaves each task one GPU, and when the local rank fell
    back to the global rank)."""
    if initialized:
        return current
    return local_rank % device_count if device_count > 0 else 0


def _torch_device_id(local_rank: int) -> int:
    import torch

    cuda = torch.cuda
    count = cuda.device_count() if cuda.is_available() else 0
    initialized = count > 0 and cuda.is_initialized()
    return default_device_id(
        local_rank, count, initialized, cuda.current_device() if initialized else 0
    )


def _not_on_disk(source: ShardSource, shard: str) -> CacheError:
    """The error for a shard the cache could not keep on disk (source="reader")."""
    disk = source.cache.disk
    if disk is None:
        return CacheError(
            f"fastload.dali: source='reader' needs shard {shard} of {source.url} on disk, "
            "and this source has no cache_dir; pass cache_dir="
        )
    return CacheFullError(
        f"fastload.dali: source='reader' pins every shard of {source.url} on disk while "
        f"the pipeline lives, and shard {shard} does not fit under the cache limit of "
        f"{disk.limit} bytes of {disk.root} (other shards and readers hold it): raise "
        "cache_limit to at least the dataset's size plus metadata, or use "
        "source='external' (reads shards through RAM when the cache is full)"
    )


def _image_field(source: ShardSource, field: str | None) -> str:
    fields = source.manifest.fields
    if field is not None:
        if field not in fields:
            raise ConfigError(f"{source.url}: no field {field!r} (fields: {', '.join(fields)})")
        return field
    for f in _IMAGE_FIELDS:
        if f in fields:
            return f
    raise ConfigError(f"{source.url}: no image field among {', '.join(fields)}; pass field=")


class _PlannedSamples:
    """The external source's callback: sample ``idx_in_epoch`` of this rank's plan.

    Stateless apart from caches (DALI may call it from several worker processes in
    any order); the plan is a pure function of (seed, epoch, world, position), so
    every worker computes the same one.
    """

    def __init__(
        self,
        source: ShardSource,
        field: str,
        state: SamplerState,
        world: World,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        window_shards: int,
    ) -> None:
        self.source = source
        self.field = field
        self.state = state
        self.world = world
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.window_shards = window_shards
        self._plans: dict[int, np.ndarray] = {}

    def plan(self, epoch_idx: int) -> np.ndarray:
        """The rank's sequence for the ``epoch_idx``-th epoch since the pipeline started
        (the first one resumes from the state's position)."""
        plan = self._plans.get(epoch_idx)
        if plan is None:
            state = self.state
            if epoch_idx:
                state = SamplerState(seed=state.seed, epoch=state.epoch + epoch_idx)
            started = state.started(self.world, self.batch_size, len(self.source))
            plan = plan_from_state(
                started,
                self.source.shard_samples,
                self.world,
                self.batch_size,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                window_shards=self.window_shards,
            )
            self._plans = {epoch_idx: plan}
        return plan

    def __call__(self, info: Any) -> tuple[np.ndarray, np.ndarray]:
        plan = self.plan(info.epoch_idx)
        if info.idx_in_epoch >= plan.size:
            raise StopIteration
        gi = int(plan[info.idx_in_epoch])
        shard, j = self.source.locate(gi)
        data = self.source.read_local(shard, j)[self.field]
        return np.frombuffer(data, dtype=np.uint8), np.array(gi, dtype=np.int64)


class DaliPipeline:
    """An iterable of decoded batches from a fastload dataset, built on DALI.

    ``device``: ``"cpu"`` or ``"gpu"`` (nvJPEG, needs CUDA; ``device_id`` defaults to
    the current CUDA device once one is chosen, else ``local_rank % device_count``:
    :func:`default_device_id`); GPU outputs stay on the GPU, with no host round trip.
    ``size``: output ``(height, width)`` or an int for a square; None keeps each
    image's size (then ``images`` is a list). ``source``:
    ``"external"`` or ``"reader"`` (see the module docstring). ``shuffle``/``seed``/
    ``world``/``drop_last``/``window_shards`` as for :class:`~fastload.StreamingDataset`
    (external source; ``drop_last`` defaults to True here: DALI's batches are full);
    ``py_workers`` DALI Python workers feed it. ``cache_dir``, ``cache_limit``,
    ``ram_limit``, ``storage_options``, ``cache_config`` and ``fetch`` as for
    :class:`~fastload.ShardedDataset`. ``state_dict()`` / ``load_state_dict()``
    resume the external source exactly. Everything after ``url`` is keyword-only
    (``batch_size`` and ``device`` by position still work for one release, with a
    DeprecationWarning).

    Raises :class:`MissingDependencyError` without DALI, :class:`ConfigError` for bad
    arguments (``source="reader"`` needs a ``cache_dir``, here or in ``cache_config``).
    """

    @keyword_only("batch_size", "device")
    def __init__(
        self,
        url: str,
        *,
        batch_size: int,
        device: str = "cpu",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        ram_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_config: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        shuffle: bool = True,
        seed: int = 0,
        world: World | None = None,
        drop_last: bool = True,
        window_shards: int = DEFAULT_WINDOW_SHARDS,
        size: int | tuple[int, int] | None = None,
        source: str = "external",
        field: str | None = None,
        num_threads: int = 2,
        py_workers: int = 1,
        py_start_method: str = "spawn",
        device_id: int | None = None,
        prefetch_queue_depth: int = 2,
    ) -> None:
        if device not in ("cpu", "gpu"):
            raise ConfigError(f"fastload.dali: device must be 'cpu' or 'gpu', got {device!r}")
        if source not in ("external", "reader"):
            raise ConfigError(
                f"fastload.dali: source must be 'external' or 'reader', got {source!r}"
            )
        if batch_size < 1:
            raise ConfigError(f"fastload.dali: batch_size must be >= 1, got {batch_size}")
        if (
            source == "reader"
            and cache_dir is None
            and (cache_config or CacheConfig()).cache_dir is None
        ):
            raise ConfigError(
                "fastload.dali: source='reader' reads shards from the NVMe cache; pass cache_dir="
            )
        if py_workers < 0:
            raise ConfigError(f"fastload.dali: py_workers must be >= 0, got {py_workers}")
        _dali()
        self.source = ShardSource(
            url,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            ram_limit=ram_limit,
            fetch=fetch,
            cache_config=cache_config,
        )
        self.field = _image_field(self.source, field)
        self.batch_size = batch_size
        self.device = device
        self.mode = source
        self.shuffle = shuffle
        self.size = (size, size) if isinstance(size, int) else size
        self.world = world or World.detect(use_torch=True)
        self.drop_last = drop_last
        self.window_shards = window_shards
        self.num_threads = num_threads
        self.py_workers = py_workers
        self.py_start_method = py_start_method
        self.prefetch_queue_depth = prefetch_queue_depth
        if device == "gpu" and device_id is None:
            device_id = _torch_device_id(self.world.local_rank)
        self.device_id = device_id
        self._state = SamplerState(seed=seed)
        self._batches_consumed = 0
        self._pipe: Any = None
        self._reader_map: dict[str, tuple[int, dict[int, int]]] = {}
        self._pinned: list[Any] = []

    # ----------------------------------------------------------------- state
    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks."""
        return self.batch_size * self.world.world_size

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (from its start)."""
        if epoch != self._state.epoch:
            self._state = SamplerState(seed=self._state.seed, epoch=int(epoch))
            self._batches_consumed = 0
            self._close_pipe()  # a pipeline is built for one epoch's plan or shuffle seed

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "sampler": SamplerState dict, "batches_consumed"}`` (external
        source only; DALI's reader has no resumable position)."""
        started = self._state.started(self.world, self.batch_size, len(self.source))
        st = started.advanced(self._batches_consumed, self.global_batch_size)
        return {"version": 1, "sampler": st.to_dict(), "batches_consumed": self._batches_consumed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s output; raises :class:`ConfigError` for the
        reader source or an incompatible state."""
        if self.mode != "external":
            raise ConfigError("fastload.dali: only source='external' resumes mid-epoch")
        if state.get("version") != 1:
            raise ConfigError(f"fastload.dali: unknown state version {state.get('version')!r}")
        self._state = SamplerState.from_dict(state["sampler"])
        self._batches_consumed = 0
        self._close_pipe()

    def __len__(self) -> int:
        """Batches this rank yields in the next epoch."""
        if self.mode == "reader":
            per_shard = -(-len(self.source) // self.world.world_size)
            return (
                len(self.source) // self.world.world_size // self.batch_size
                if self.drop_last
                else -(-per_shard // self.batch_size)
            )
        st = self._state.started(self.world, self.batch_size, len(self.source))
        return epoch_steps(
            len(self.source),
            self.global_batch_size,
            canonical_nodes=st.canonical_nodes or 1,
            drop_last=self.drop_last,
            samples_consumed=st.samples_consumed,
        )

    # ----------------------------------------------------------------- build
    def _decode(self, fn: Any, types: Any, encoded: Any) -> Any:
        decode_device = "mixed" if self.device == "gpu" else "cpu"
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB)
        if self.size is not None:
            h, w = self.size
            images = fn.resize(images, resize_x=w, resize_y=h)
        return images

    def _build(self) -> Any:
        dali = _dali()
        import nvidia.dali.fn
        import nvidia.dali.types

        fn: Any = nvidia.dali.fn
        types: Any = nvidia.dali.types

        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_threads": self.num_threads,
            "device_id": self.device_id if self.device == "gpu" else None,
            "prefetch_queue_depth": self.prefetch_queue_depth,
            "exec_dynamic": True,
        }
        if self.mode == "external":
            start = SamplerState(
                seed=self._state.seed,
                epoch=self._state.epoch,
                samples_consumed=self._state.samples_consumed
                + self._batches_consumed * self.global_batch_size,
                canonical_nodes=self._state.canonical_nodes,
            )
            self._state, self._batches_consumed = start, 0
            callback = _PlannedSamples(
                self.source,
                self.field,
                start,
                self.world,
                self.batch_size,
                self.shuffle,
                self.drop_last,
                self.window_shards,
            )
            parallel = self.py_workers > 0
            if parallel:
                kwargs.update(py_num_workers=self.py_workers, py_start_method=self.py_start_method)
            pipe = dali.pipeline.Pipeline(**kwargs)
            with pipe:
                encoded, index = fn.external_source(
                    source=callback,
                    num_outputs=2,
                    batch=False,
                    parallel=parallel,
                    dtype=[types.UINT8, types.INT64],
                )
                pipe.set_outputs(self._decode(fn, types, encoded), index)
        else:
            paths, index_paths = self._stage_shards()
            pipe = dali.pipeline.Pipeline(**kwargs)
            with pipe:
                encoded = fn.readers.webdataset(
                    paths=paths,
                    index_paths=index_paths,
                    ext=[self.field],
                    missing_component_behavior="error",
                    random_shuffle=self.shuffle,
                    seed=self._state.seed + 1000003 * self._state.epoch,
                    shard_id=self.world.rank,
                    num_shards=self.world.world_size,
                    pad_last_batch=not self.drop_last,
                    name=_READER,
                )
                info = fn.get_property(encoded, key="source_info")
                pipe.set_outputs(self._decode(fn, types, encoded), info)
        pipe.build()
        return pipe

    def _stage_shards(self) -> tuple[list[str], list[str]]:
        """Make every shard local (NVMe tier, pinned while the pipeline lives) and write
        DALI index files for them; remember how to map source_info to indices."""
        src = self.source
        digest = hashlib.sha256(src.dataset_id.encode()).hexdigest()[:16]
        index_dir = os.path.join(src.cache_dir or tempfile.gettempdir(), "dali-index", digest)
        os.makedirs(index_dir, exist_ok=True)
        paths, index_paths = [], []
        starts = src._starts
        for s, info in enumerate(src.manifest.shards):
            cached = src.cache.open_shard(src.dataset_id, info, src._fetcher(info.name, info.bytes))
            if cached.path is None:
                # the cache was full (or a download of it stalled) and the shard was
                # read into RAM only: DALI's reader needs a file, so say which and why
                cached.close()
                for held in self._pinned:
                    held.close()
                self._pinned.clear()
                raise _not_on_disk(src, info.name)
            self._pinned.append(cached)
            idx = src.index(s)
            idx_path = os.path.join(index_dir, f"{info.checksum.split(':')[1]}.idx")
            if not os.path.exists(idx_path):
                tmp = f"{idx_path}.{os.getpid()}.tmp"
                idx.write_dali_index(tmp)
                os.replace(tmp, idx_path)
            offsets = {}
            for j in range(idx.num_samples):
                span = idx.sample(j)[self.field]
                offsets[int(span[0])] = int(starts[s]) + j
            self._reader_map[str(cached.path)] = (s, offsets)
            paths.append(str(cached.path))
            index_paths.append(idx_path)
        return paths, index_paths

    # -------------------------------------------------------------- iterate
    def _reader_index(self, info: np.ndarray) -> int:
        text = bytes(info).decode()
        path, offset, _name = text.rsplit(":", 2)
        return self._reader_map[path][1][int(offset)]

    def _to_torch(self, tl: Any, uniform: bool) -> Any:
        import torch

        if self.device == "gpu":
            from nvidia.dali.plugin.pytorch import feed_ndarray

            device = torch.device("cuda", self.device_id or 0)
            stream = torch.cuda.current_stream(device)
            if uniform:
                tensor = tl.as_tensor()
                out = torch.empty(tensor.shape(), dtype=torch.uint8, device=device)
                feed_ndarray(tensor, out, cuda_stream=stream)
                return out
            # images of different sizes: one device buffer, each image copied into its
            # own view of it on torch's current stream (never through the host)
            samples = [tl[i] for i in range(len(tl))]
            shapes = [tuple(t.shape()) for t in samples]
            sizes = [int(np.prod(sh)) for sh in shapes]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
            views, start = [], 0
            for t, shape, n in zip(samples, shapes, sizes, strict=True):
                view = flat[start : start + n].view(shape)
                feed_ndarray(t, view, cuda_stream=stream)
                views.append(view)
                start += n
            return views
        if uniform:
            return torch.from_numpy(tl.as_array())
        return [torch.from_numpy(np.array(tl[i])) for i in range(len(tl))]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch

        if self._pipe is None:
            self._pipe = self._build()
        pipe = self._pipe
        for _ in range(len(self)):
            try:
                images, second = pipe.run()
            except StopIteration:
                break
            if self.mode == "external":
                index = torch.from_numpy(second.as_array().reshape(-1).copy())
            else:
                index = torch.tensor(
                    [self._reader_index(np.array(second[i])) for i in range(len(second))],
                    dtype=torch.int64,
                )
            self._batches_consumed += 1
            yield {"images": self._to_torch(images, self.size is not None), "index": index}
        # the epoch is over: the next iteration is the next epoch
        self._state = SamplerState(seed=self._state.seed, epoch=self._state.epoch + 1)
        self._batches_consumed = 0
        self._close_pipe()

    def _close_pipe(self) -> None:
        self._pipe = None

    def close(self) -> None:
        """Drop the DALI pipeline, unpin staged shards, release the cache."""
        self._close_pipe()
        for cached in self._pinned:
            cached.close()
        self._pinned.clear()
        self.source.close()
