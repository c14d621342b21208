"""DALI pipelines fed from fastload's cache (needs the ``dali`` extra).

``fastload.dali.pipeline(url, batch_size, device="cpu"|"gpu", ...)`` returns an
iterable of ``{"images": ..., "index": ...}`` batches; see
:mod:`fastload.dali._pipeline`. DALI itself is imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DaliPipeline", "pipeline"]


def pipeline(url: str, batch_size: int, device: str = "cpu", **kwargs: Any) -> Any:
    """Build a :class:`~fastload.dali._pipeline.DaliPipeline`; see its docstring."""
    from fastload.dali._pipeline import DaliPipeline

    return DaliPipeline(url, batch_size, device=device, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "DaliPipeline":
        from fastload.dali._pipeline import DaliPipeline

        return DaliPipeline
    raise AttributeError(f"module 'fastload.dali' has no attribute {name!r}")
