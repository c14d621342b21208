"""DALI pipelines fed from fastload's cache (needs the ``dali`` extra).

``fastload.dali.pipeline(url, batch_size=..., device="cpu"|"gpu", ...)`` returns an
iterable of ``{"images": ..., "index": ...}`` batches; see
:class:`~fastload.dali._pipeline.DaliPipeline`. DALI itself is imported on first use.
"""

from __future__ import annotations

from fastload.dali._pipeline import DaliPipeline

__all__ = ["DaliPipeline", "pipeline"]

#: ``pipeline(url, batch_size=..., device="cpu"|"gpu", ...)`` builds a
#: :class:`DaliPipeline`: it is the class itself, so the two never take different
#: arguments (importing this module imports no DALI; building a pipeline does).
pipeline = DaliPipeline
