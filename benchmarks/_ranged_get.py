"""Ranged GETs on a raw aiobotocore client: the store-side ceilings and bounds of the
storage and transport benchmarks (no retry bookkeeping, no thread hops)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

#: bytes read from a response body at a time
PIECE = 1 << 20

#: ``sink(key, piece, offset)``: where each piece of a range goes
Sink = Callable[[str, bytes, int], None]


async def ranged_gets(
    client: Any,
    bucket: str,
    jobs: Sequence[tuple[str, int, int]],
    in_flight: int,
    sink: Sink | None = None,
) -> int:
    """GET every ``(key, start, end)`` byte range of ``bucket`` with at most
    ``in_flight`` requests at once, reading each body in :data:`PIECE` pieces handed
    to ``sink`` at their offset (None: dropped, nothing copied or joined). Returns
    the bytes read; errors from the client propagate."""
    sem = asyncio.Semaphore(in_flight)

    async def one(key: str, start: int, end: int) -> int:
        async with sem:
            resp = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            body, pos = resp["Body"], start
            while chunk := await body.read(PIECE):
                if sink is not None:
                    sink(key, chunk, pos)
                pos += len(chunk)
            body.close()
            return pos - start

    return sum(await asyncio.gather(*(one(*job) for job in jobs)))
