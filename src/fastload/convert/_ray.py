"""Conversion on Ray (``executor="ray"``, ``fastload convert ... --ray``).

The driver plans as the local converter does (the list of inputs, in order, and the
source metadata), cuts the list into contiguous parts and runs one Ray task per
part: it reads, verifies and writes its samples with its own
:class:`~fastload.ShardWriter` under a name prefix no other task and no live
dataset uses (``<generation><part>-``), publishing shards and sidecars but no
manifest. The driver then merges the parts' shard lists in input order into one
manifest and publishes it as :class:`~fastload.ShardWriter` does: atomically,
interrupts held back, the replaced dataset's files deleted after. If any part
fails, or the driver is interrupted, the other parts are cancelled and every
object with the run's generation prefix is deleted, so the output is as it was.

Inputs are read by the tasks, so a multi-node cluster needs the source at the same
path on every node (a shared file system). Ray connects to ``RAY_ADDRESS`` when it
is set, otherwise to a local runtime started for the conversion.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from typing import Any, TypeVar

from fastload.config import env
from fastload.convert._common import (
    ConvertReport,
    SkippedItem,
    SourceDataError,
    progress_bar,
    read_ordered,
)
from fastload.errors import ConfigError, FastloadError, MissingDependencyError, StorageError
from fastload.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo
from fastload.shards.writer import (
    ShardWriter,
    defer_interrupts,
    delete_objects,
    drop_previous,
    generation_prefix,
    previous_dataset,
)

__all__ = ["EXECUTORS", "check_executor", "convert_on_ray"]

T = TypeVar("T")
R = TypeVar("R")

#: The values ``executor=`` takes.
EXECUTORS = ("local", "ray")


def check_executor(executor: str) -> str:
    """Return ``executor`` if valid, else raise :class:`ConfigError`."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    return executor


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("ray", "ray", "converting on Ray (executor='ray')") from None
    return ray


def _write_part(
    part: int,
    items: list[tuple[int, Any]],
    read: Callable[[Any], Any],
    make_sample: Callable[[int, Any, Any], Mapping[str, Any]],
    label: Callable[[Any], str],
    spec: dict[str, Any],
) -> dict[str, Any]:
    """One Ray task: read and write ``items`` (``(input index, item)``) as shards."""
    writer = ShardWriter(
        spec["out"],
        shard_size=spec["shard_size"],
        storage_options=spec["storage_options"],
        source={},
        name_prefix=f"{spec['prefix']}{part:05d}-",
        publish=False,
    )
    skipped: list[dict[str, Any]] = []
    written: list[int] = []
    with (
        writer,
        closing(read_ordered(items, lambda t: read(t[1]), spec["workers"])) as results,
    ):
        for (index, item), result in results:
            if isinstance(result, SourceDataError):
                if spec["on_error"] == "raise":
                    raise result
                skipped.append(
                    SkippedItem(item=label(item), path=result.path, reason=result.reason).to_dict()
                )
                continue
            writer.write(make_sample(index, item, result))
            written.append(index)
    assert writer.manifest is not None
    return {
        "shards": [s.to_dict() for s in writer.manifest.shards],
        "fields": list(writer.manifest.fields),
        "skipped": skipped,
        "written": written,
    }


def _cause(exc: BaseException) -> BaseException:
    """The exception a Ray task raised, out of Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def convert_on_ray(
    todo: Sequence[T],
    read: Callable[[T], R],
    make_sample: Callable[[int, T, R], Mapping[str, Any]],
    label: Callable[[T], str],
    *,
    out: str,
    source: dict[str, Any],
    finish_source: Callable[[dict[str, Any], list[int], list[SkippedItem]], None],
    shard_size: int | str,
    storage_options: Mapping[str, Any] | None,
    workers: int,
    on_error: str,
    progress: bool,
    overwrite: bool,
    desc: str,
    skipped_before: Sequence[SkippedItem] = (),
    parts: int | None = None,
) -> ConvertReport:
    """Convert ``todo`` on Ray; see the module docstring.

    ``read(item)`` returns what ``make_sample(index, item, result)`` turns into a
    sample (it raises :class:`SourceDataError` for a bad input; ``label(item)``
    names it in the report); ``finish_source(source, written indices, skipped)``
    completes the manifest's source before it is published; ``skipped_before`` are
    inputs the planning already left out. ``parts`` defaults to two per CPU of the
    cluster. Returns the :class:`ConvertReport`.
    """
    from fastload.storage import open_store

    ray = _ray()
    started = False
    if not ray.is_initialized():
        address = env("RAY_ADDRESS")
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        store = open_store(out, storage_options)
        _, previous = previous_dataset(store, out, overwrite)
        try:
            existing = store.list()
        except FileNotFoundError:
            existing = []
        prefix = generation_prefix(existing)
        if prefix == "shard-":
            prefix = "shard-r"  # even a first run's parts get names of their own
        if parts is None:
            parts = max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
        parts = max(1, min(parts, len(todo)))
        size = math.ceil(len(todo) / parts) if todo else 0
        chunks = [list(enumerate(todo))[k * size : (k + 1) * size] for k in range(parts)]
        chunks = [c for c in chunks if c]
        spec = {
            "out": out,
            "shard_size": shard_size,
            "storage_options": dict(storage_options or {}),
            "prefix": prefix,
            "workers": workers,
            "on_error": on_error,
        }
        task = ray.remote(_write_part)
        refs = [task.remote(k, c, read, make_sample, label, spec) for k, c in enumerate(chunks)]
        state = {"published": False}
        try:
            results = _gather(ray, refs, len(todo), desc, progress, [len(c) for c in chunks])
            report = _publish(store, out, source, finish_source, results, previous, state)
            report.skipped[:0] = skipped_before
        except BaseException as exc:
            if state["published"]:
                raise  # an interrupt held back while publishing: the dataset is complete
            with defer_interrupts():
                # A cancelled task gets KeyboardInterrupt, so its writer deletes its own
                # files; whatever a task left (or one killed outright) is deleted here.
                # Only parts still running: cancelling a finished task has aborted Ray's
                # core worker here (task_manager.cc 'Tried to complete task that was not
                # pending', a race inside Ray), which this narrows without closing.
                _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in running:
                    ray.cancel(ref)
                ray.wait(refs, num_returns=len(refs), timeout=30)
                ours = [n for n in _list(store) if n.rsplit("/", 1)[-1].startswith(prefix)]
                left = delete_objects(store, ours)
                _remove_empty_temp_dirs(store)
            if left:
                raise StorageError(
                    f"{out}: the failed Ray conversion could not delete its partial shard "
                    "files: " + ", ".join(left)
                ) from _cause(exc)
            cause = _cause(exc)
            if cause is not exc:
                raise cause from None
            raise
        if progress and report.skipped:
            print(report.summary(), file=sys.stderr)
        return report
    finally:
        if started:
            ray.shutdown()


def _remove_empty_temp_dirs(store: Any) -> None:
    """Remove the writers' temporary directories left empty in a local output."""
    import contextlib
    import os

    if store.protocol != "file":
        return
    root = store.root.removeprefix("file://")
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.is_dir() and entry.name.startswith(".fastload-write-"):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)  # only if empty


def _list(store: Any) -> list[str]:
    try:
        return list(store.list())
    except FileNotFoundError:
        return []


def _gather(
    ray: Any, refs: list[Any], total: int, desc: str, progress: bool, sizes: list[int]
) -> list[dict[str, Any]]:
    """Wait for every part (in any order) and return their results in part order."""
    results: dict[int, dict[str, Any]] = {}
    index = {ref: k for k, ref in enumerate(refs)}
    pending = list(refs)
    with progress_bar(total, desc, progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                k = index[ref]
                results[k] = ray.get(ref)  # raises the part's error
                bar.update(sizes[k])
    return [results[k] for k in range(len(refs))]


def _publish(
    store: Any,
    out: str,
    source: dict[str, Any],
    finish_source: Callable[[dict[str, Any], list[int], list[SkippedItem]], None],
    results: list[dict[str, Any]],
    previous: Manifest | None,
    state: dict[str, bool],
) -> ConvertReport:
    shards: list[ShardInfo] = []
    fields: set[str] = set()
    written: list[int] = []
    skipped: list[SkippedItem] = []
    for r in results:
        doc = {"format": "fastload", "version": 1, "shards": r["shards"]}
        shards.extend(Manifest.from_dict(doc, out).shards)
        fields.update(r["fields"])
        written.extend(r["written"])
        skipped.extend(SkippedItem(**s) for s in r["skipped"])
    source = dict(source)
    finish_source(source, written, skipped)
    manifest = Manifest.build(shards, fields, source, url=out)
    if len({s.name for s in shards}) != len(shards):
        raise FastloadError(f"{out}: two Ray parts wrote the same shard name; a bug in fastload")
    with defer_interrupts():
        store.write_bytes(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
        state["published"] = True
        drop_previous(store, out, manifest, previous)
    return ConvertReport(manifest, skipped)
