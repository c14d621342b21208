"""Whether ``torchvision.io`` decodes JPEGs in this environment, for the decoding tests.

torchvision imports in the suite through ``tests/support/torchvision_shim.py``, but its
image extension (``decode_jpeg``) is a separate library that the registry's wheel cannot
load beside the CPU torch. The tests that decode with torchvision skip then, with that
reason; ``test_the_probe_tells_the_truth`` (``tests/gpu/test_nvjpeg.py``) holds the
probe to what ``decode_jpeg`` really does.
"""

from __future__ import annotations

import importlib.util

import pytest

from fastload.errors import MissingDependencyError


def decoding_problem() -> str | None:
    """Why torchvision cannot decode JPEGs here, or None when it can."""
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision is not installed (extra 'gpu')"
    from fastload.decode.gpu import image_extension_problem

    try:
        problem = image_extension_problem()
    except MissingDependencyError as exc:  # torchvision does not import here
        return f"torchvision does not import beside this torch: {exc.__cause__!r}"
    return problem  # "torchvision X imports, but torchvision.io's image extension ..."


PROBLEM = decoding_problem()
#: Marks a test that decodes with ``torchvision.io``.
needs_torchvision_io = pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))
