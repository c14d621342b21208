"""Which URL schemes fastload can open, and a clear refusal of the others.

fastload serves ``s3``/``s3a``/``cos`` through s3fs and every other scheme through
fsspec. :func:`check_protocol` turns fsspec's ``ValueError: Protocol not known`` and
its bare ``ImportError`` for an absent backend into fastload errors that name the
URL, the supported schemes, and the package (and extra) to install. It reads only
fsspec's registry and the import path: no network.
"""

from __future__ import annotations

import functools
import importlib.util

from fastload.errors import ConfigError, MissingDependencyError

__all__ = ["check_protocol", "supported_protocols"]

_S3_PROTOCOLS = ("s3", "s3a", "cos")
# fsspec protocols that wrap another filesystem rather than name a store
_WRAPPERS = frozenset(
    {"async_wrapper", "asyncwrapper", "blockcache", "cached", "dir", "filecache", "generic",
     "simplecache", "reference", "tar", "zip", "libarchive", "data"}
)  # fmt: skip
# fsspec protocol -> (package, fastload extra) for the backends fastload has an extra for
_BACKEND_EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "cos": ("s3fs", "s3")}


@functools.lru_cache(maxsize=64)
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def supported_protocols() -> list[str]:
    """The URL schemes fastload can open: its own (``s3``, ``s3a``, ``cos``) and fsspec's
    (installed or not), without fsspec's wrapper protocols."""
    from fsspec.registry import known_implementations, registry

    names = set(known_implementations) | set(registry) | set(_S3_PROTOCOLS)
    return sorted(n for n in names if n not in _WRAPPERS)


def check_protocol(protocol: str, url: str) -> None:
    """Refuse a scheme no backend serves (:class:`ConfigError` listing the supported
    ones) or one whose backend package is not installed
    (:class:`MissingDependencyError` naming the package and the extra, or a
    :class:`ConfigError` with fsspec's hint where fastload has no extra for it)."""
    from fsspec.registry import known_implementations, registry

    if protocol in ("file", "local", "memory") or protocol in registry:
        return
    spec = known_implementations.get(protocol)
    if spec is None and protocol not in _S3_PROTOCOLS:
        raise ConfigError(
            f"{url}: unknown URL scheme '{protocol}://'; supported: "
            + ", ".join(f"{p}://" for p in supported_protocols())
        )
    package = (_BACKEND_EXTRAS.get(protocol) or (str((spec or {})["class"]).split(".")[0], ""))[0]
    if not _installed(package):
        if protocol in _BACKEND_EXTRAS:
            extra = _BACKEND_EXTRAS[protocol][1]
            raise MissingDependencyError(package, extra, f"{url} ({protocol}://)")
        hint = (spec or {}).get("err") or f"install {package}"
        raise ConfigError(f"{url}: the {protocol}:// backend is not installed ({hint})")
