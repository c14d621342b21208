"""The one loop every image converter runs: read the inputs in parallel and in order,
write the samples into shards, locally or on Ray, and report what was skipped.

A converter plans its inputs (``todo``) and says how to read one, how to turn what was
read into a sample, how to name an input in the report, and what the manifest's
``source`` says besides the count of inputs skipped; :func:`write_samples` does the rest
the same way for COCO, Cityscapes and image folders.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any, TypeVar

from fastload.convert._common import (
    ConvertReport,
    ErrorPolicy,
    SourceDataError,
    default_workers,
    finish,
    progress_bar,
    read_ordered,
)
from fastload.convert._ray import check_executor
from fastload.errors import ConfigError
from fastload.shards.writer import ShardWriter

__all__ = ["WriteSettings", "write_samples"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class WriteSettings:
    """How a converter writes: the arguments every converter takes besides its
    inputs, checked once (:meth:`make`)."""

    out: str
    shard_size: int | str
    storage_options: Mapping[str, Any] | None
    workers: int
    progress: bool
    overwrite: bool
    executor: str

    @classmethod
    def make(
        cls,
        out: str | os.PathLike[str],
        shard_size: int | str,
        storage_options: Mapping[str, Any] | None,
        workers: int | None,
        progress: bool,
        overwrite: bool,
        executor: str,
    ) -> WriteSettings:
        """Settings (arguments in the field order) with ``workers`` defaulted
        (:func:`default_workers`); raises :class:`ConfigError` for an unknown
        executor or fewer than one worker."""
        check_executor(executor)
        workers = default_workers() if workers is None else workers
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        return cls(
            os.fspath(out), shard_size, storage_options, workers, progress, overwrite, executor
        )


def write_samples(
    todo: Sequence[T],
    read: Callable[[T], R],
    make_sample: Callable[[int, T, R], Mapping[str, Any]],
    label: Callable[[T], str],
    *,
    settings: WriteSettings,
    policy: ErrorPolicy,
    source: dict[str, Any],
    desc: str,
    finish_source: Callable[[dict[str, Any], list[int]], None] | None = None,
) -> ConvertReport:
    """Read every input of ``todo`` (``read(item)``, on ``settings.workers`` threads, in
    order) and write ``make_sample(n, item, result)`` into shards at ``settings.out``.

    ``n`` numbers the sample: the samples written before it locally, the input's
    index on Ray (where a skipped input leaves a gap). An input whose read raised
    :class:`SourceDataError` goes to ``policy`` under ``label(item)``.
    ``finish_source(source, written)`` completes the manifest's source before it is
    published: ``written`` are the indices in ``todo`` of the samples written. Then
    ``source["skipped"]`` counts every input left out, those the planning already gave
    ``policy`` included. Returns the :class:`ConvertReport`.
    """

    def complete(src: dict[str, Any], written: list[int], skipped: int) -> None:
        if finish_source is not None:
            finish_source(src, written)
        src["skipped"] = skipped

    if settings.executor == "ray":
        from fastload.convert._ray import convert_on_ray

        planned = len(policy.skipped)
        return convert_on_ray(
            todo,
            read,
            make_sample,
            label,
            out=settings.out,
            source=source,
            finish_source=lambda src, done, bad: complete(src, done, planned + len(bad)),
            shard_size=settings.shard_size,
            storage_options=settings.storage_options,
            workers=settings.workers,
            on_error=policy.on_error,
            progress=settings.progress,
            overwrite=settings.overwrite,
            desc=f"{desc} (ray)",
            skipped_before=policy.skipped,
        )
    writer = ShardWriter(
        settings.out,
        shard_size=settings.shard_size,
        storage_options=settings.storage_options,
        source=source,
        overwrite=settings.overwrite,
    )
    written: list[int] = []
    with (
        writer,
        progress_bar(len(todo), desc, settings.progress) as bar,
        closing(read_ordered(todo, read, settings.workers)) as results,
    ):
        for k, (item, result) in enumerate(results):
            bar.update(1)
            if isinstance(result, SourceDataError):
                policy.bad(label(item), result)
                continue
            writer.write(make_sample(writer.samples_written, item, result))
            written.append(k)
        # The source is finished only now: skipped inputs are not in it.
        complete(writer.source, written, len(policy.skipped))
    return finish(writer, policy, settings.progress)
