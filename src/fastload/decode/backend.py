"""Which image backend runs: Pillow or Pillow-SIMD, its version and its JPEG library."""

from __future__ import annotations

import platform
from typing import Any

from fastload.decode._deps import pil_image

__all__ = ["backend_info"]

# x86 and ARM vector extensions worth reporting next to a decode benchmark.
_SIMD_FLAGS = ("sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "avx512f", "avx512bw", "neon")


def _cpu_simd_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    present = set(value.split())
                    return [flag for flag in _SIMD_FLAGS if flag in present]
    except OSError:
        pass
    return []


def _feature_version(features: Any, name: str) -> str | None:
    try:
        version = features.version_feature(name)
    except (ValueError, AttributeError):
        return None
    return None if version is None else str(version)


def backend_info() -> dict[str, Any]:
    """Describe the image decoder in use, for benchmark reports.

    Returns a JSON-serialisable dict: ``library`` (``"Pillow"`` or ``"Pillow-SIMD"``:
    Pillow-SIMD is recognised by the ``.postN`` suffix of its version), ``version``,
    ``libjpeg_turbo`` (bool) and ``libjpeg_turbo_version``, ``jpeg_version``,
    ``zlib_version``, ``webp`` (what Pillow was built with), and ``cpu_simd`` (the
    vector extensions this CPU has; Pillow does not expose the flags it was compiled
    with, so this is what the CPU offers it).
    Raises :class:`~fastload.errors.MissingDependencyError` without Pillow.
    """
    image = pil_image()
    import PIL
    from PIL import features

    version = str(PIL.__version__)
    simd = ".post" in version
    return {
        "library": "Pillow-SIMD" if simd else "Pillow",
        "version": version,
        "pillow_simd": simd,
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "libjpeg_turbo_version": _feature_version(features, "libjpeg_turbo"),
        "jpeg_version": features.version("jpg"),
        "zlib_version": features.version("zlib"),
        "webp": bool(features.check("webp")),
        "module": getattr(image, "__file__", None),
        "machine": platform.machine(),
        "cpu_simd": _cpu_simd_flags(),
    }
