"""Every knob of fastload in one place.

Settings are dataclasses with documented defaults. ``FASTLOAD_*`` environment
variables are read here and only here (:func:`env`), so the rest of the code
takes its settings as arguments.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import ConfigError

__all__ = [
    "MAX_IMAGE_PIXELS",
    "CacheConfig",
    "FetchConfig",
    "RetryConfig",
    "default_cache_dir",
    "default_config_dir",
    "default_workers",
    "env",
    "format_size",
    "parse_size",
    "usable_cpus",
]

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "P": 10**15,
    "PB": 10**15,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | float | str, what: str = "size") -> int:
    """Return a byte count from ``value``: an int, or a string like ``"64MB"``,
    ``"1.5GiB"``, ``"400GB"`` (decimal units: KB, MB, GB, TB; binary: KiB, MiB, …).

    Raises :class:`ConfigError` naming ``what`` on a malformed or negative value.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a byte count or a string like '64MB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what}: must not be negative, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value or value in (float("inf"),):
            raise ConfigError(f"{what}: must be a finite non-negative number, got {value}")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = m.group(2).upper()
            if unit in _UNITS:
                return int(float(m.group(1)) * _UNITS[unit])
        raise ConfigError(
            f"{what}: cannot parse {value!r} as a size; use bytes or a number with a unit "
            "such as '64MB', '1.5GB' or '512MiB'"
        )
    raise ConfigError(f"{what}: expected a byte count or a string like '64MB', got {value!r}")


def format_size(n: float) -> str:
    """Format a byte count for people: ``format_size(1_500_000) == '1.50 MB'``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"  # pragma: no cover


def env(name: str, default: str | None = None) -> str | None:
    """Read the environment variable ``name`` (``FASTLOAD_*``, ``AWS_*``, ``COS_*``, …).

    The one place fastload reads the environment: other modules call this (or take
    the value as an argument), so every variable the library honours is found here.
    """
    return os.environ.get(name, default)


def default_cache_dir() -> str:
    """The node-local cache directory when none is given: ``$FASTLOAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fastload``, else ``~/.cache/fastload``."""
    explicit = env("FASTLOAD_CACHE_DIR")
    if explicit:
        return explicit
    base = env("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


@dataclass(frozen=True)
class RetryConfig:
    """Retry policy knobs for object-storage reads (exponential backoff with full jitter)."""

    max_attempts: int = 8
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    deadline_s: float = 300.0
    #: Per-request socket timeout; a stalled connection past it is retried.
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryConfig.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("RetryConfig backoffs must not be negative")
        if self.deadline_s <= 0 or self.timeout_s <= 0:
            raise ConfigError("RetryConfig.deadline_s and timeout_s must be positive")


@dataclass(frozen=True)
class FetchConfig:
    """How whole objects are read: objects above ``parallel_threshold`` bytes are read
    as ``concurrency`` parallel ranged GETs of ``part_size`` bytes; one process keeps at
    most ``streams`` GETs of whole-object downloads in flight across all of them."""

    part_size: int = 16 * 2**20
    concurrency: int = 16
    #: Objects above it are split into parts. Measured on a cold epoch of 32 MB shards
    #: from SeaweedFS: one GET per shard, many shards at once, beat 2 ranged parts each
    #: (0.69x against 0.54x of the fetch-and-write bound, paired over 8 rounds).
    parallel_threshold: int = 32 * 2**20
    retry: RetryConfig = field(default_factory=RetryConfig)
    #: GETs of whole-object downloads in flight per process and endpoint, all downloads
    #: together, served first come first served: the prefetcher can start every shard
    #: of the plan and the earliest still complete first, with the pipe kept full.
    streams: int = 16
    #: S3 GET bodies are read over plain blocking HTTP connections (presigned by the
    #: client, hashed as they arrive) instead of through aiohttp, except where a proxy
    #: is configured; see :mod:`fastload.storage.direct`. Measured: 0.17 against 0.27
    #: CPU s per 316 MB, the checksum included.
    direct_reads: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "part_size", parse_size(self.part_size, "part_size"))
        object.__setattr__(
            self, "parallel_threshold", parse_size(self.parallel_threshold, "parallel_threshold")
        )
        if self.part_size <= 0:
            raise ConfigError("FetchConfig.part_size must be positive")
        if self.concurrency < 1:
            raise ConfigError(f"FetchConfig.concurrency must be >= 1, got {self.concurrency}")
        if self.streams < 1:
            raise ConfigError(f"FetchConfig.streams must be >= 1, got {self.streams}")


@dataclass(frozen=True)
class CacheConfig:
    """The local tiers: the NVMe directory and its byte cap, the RAM budget, prefetch depth."""

    cache_dir: str | None = None
    cache_limit: int | str | None = None
    ram_limit: int | str = 2 * 10**9
    #: How long a process waits for another one's download of the same shard.
    wait_deadline_s: float = 600.0
    #: Shards a dataset prefetches ahead of the one it reads (its ``prefetch_shards``
    #: argument, when given, sets this).
    prefetch_shards: int = 2
    prefetch_bytes: int | str = 4 * 10**9
    #: Downloads the prefetcher runs at once (each is itself parallel ranged GETs for
    #: shards above ``FetchConfig.parallel_threshold``).
    prefetch_workers: int = 16
    #: When cached files are re-hashed: ``"publish"`` (once, before they become
    #: visible) or ``"open"`` (also every time a process opens one).
    verify: str = "publish"
    #: How long a fetch waits for room under the disk cap (held by pins and other
    #: downloads) before it reads the shard without caching it (RAM only, the cap
    #: untouched, counted as ``uncached_reads``; see ``on_full``).
    room_wait_s: float = 5.0
    #: What a full cache does once ``room_wait_s`` has passed: ``"stream"`` reads the
    #: shard uncached (warned once per process), ``"raise"`` raises ``CacheFullError``.
    on_full: str = "stream"
    #: A download whose process shows no heartbeat for this long (stopped with
    #: SIGSTOP, frozen, hung) is bypassed: waiters read the shard uncached instead
    #: (``lease_bypasses``). A waiter is held up by a stopped holder at most
    #: ``lease_s`` + 0.25 s (about 2 s once the holder's lease has run out).
    lease_s: float = 10.0
    #: ``cache_dir`` is shared by a group that trusts itself (2770/0660 accepted).
    shared: bool = False
    #: fsync every entry before it becomes visible. Off: entries are published
    #: unsynced, tagged with the boot id, and re-hashed on their first open after a
    #: reboot (see :mod:`fastload.cache.disk`).
    sync_publish: bool = False

    def __post_init__(self) -> None:
        if self.room_wait_s < 0:
            raise ConfigError("CacheConfig.room_wait_s must not be negative")
        if self.on_full not in ("stream", "raise"):
            raise ConfigError(
                f"CacheConfig.on_full must be 'stream' or 'raise', got {self.on_full!r}"
            )
        if self.lease_s <= 0:
            raise ConfigError("CacheConfig.lease_s must be positive")
        if self.cache_limit is not None:
            object.__setattr__(self, "cache_limit", parse_size(self.cache_limit, "cache_limit"))
        object.__setattr__(self, "ram_limit", parse_size(self.ram_limit, "ram_limit"))
        object.__setattr__(
            self, "prefetch_bytes", parse_size(self.prefetch_bytes, "prefetch_bytes")
        )
        if self.wait_deadline_s <= 0:
            raise ConfigError("CacheConfig.wait_deadline_s must be positive")
        if self.prefetch_shards < 0:
            raise ConfigError("CacheConfig.prefetch_shards must not be negative")
        if self.prefetch_workers < 1:
            raise ConfigError("CacheConfig.prefetch_workers must be >= 1")
        if self.verify not in ("publish", "open"):
            raise ConfigError(
                f"CacheConfig.verify must be 'publish' or 'open', got {self.verify!r}"
            )

    def with_arguments(self, **given: Any) -> CacheConfig:
        """This config combined with a dataset's explicit arguments of the same names
        (``cache_dir``, ``cache_limit``, ``ram_limit``, ``prefetch_shards``).

        The rule: an argument left ``None`` takes this config's value; an argument
        given sets the field where this config leaves it at its default; an argument
        given beside a different value set in this config is a :class:`ConfigError`
        naming both (nothing passed is ever silently dropped).
        """
        default = CacheConfig()
        changes: dict[str, Any] = {}
        for name, value in given.items():
            if value is None:
                continue
            if not hasattr(default, name):
                raise TypeError(f"CacheConfig has no field {name!r}")
            mine, theirs = getattr(self, name), getattr(default, name)
            if name in ("cache_limit", "ram_limit"):
                value = parse_size(value, name)
            elif name == "cache_dir":
                value = os.path.expanduser(os.fspath(value))
                mine = None if mine is None else os.path.expanduser(os.fspath(mine))
            if mine != theirs and mine != value:
                raise ConfigError(
                    f"{name}={value!r} conflicts with cache_config.{name}={mine!r}: "
                    "set it in one place"
                )
            changes[name] = value
        return dataclasses.replace(self, **changes) if changes else self


def default_config_dir() -> str:
    """The user's fastload configuration directory (it holds the key that
    authenticates :func:`fastload.cached` items): ``$FASTLOAD_CONFIG_DIR``, else
    ``$XDG_CONFIG_HOME/fastload``, else ``~/.config/fastload``."""
    explicit = env("FASTLOAD_CONFIG_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    base = env("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fastload")


#: The most pixels (width x height) fastload decodes from one image; a header above it
#: is a :class:`~fastload.errors.DecodeError` naming the sample before any pixel is
#: allocated (Pillow's own default, 1024 x 1024 x 1024 // 4 // 3, about 256 MiB of RGB).
MAX_IMAGE_PIXELS = 89_478_485


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or a
    ``taskset``'s share, not the machine's count), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


#: What each pool defaults to, as (per usable CPU, at most): reader threads of the
#: converters (reads and PIL decodes release the GIL), threads adopting existing
#: shards (mostly waiting on the store), the DataLoader's decode threads (one core
#: each), and the benchmark's loader workers.
WORKER_DEFAULTS: dict[str, tuple[int, int]] = {
    "convert": (2, 16),
    "adopt": (4, 32),
    "loader": (1, 8),
    "bench": (1, 8),
}


def default_workers(kind: str) -> int:
    """The default size of the ``kind`` pool (a key of :data:`WORKER_DEFAULTS`):
    ``per_cpu`` × :func:`usable_cpus`, capped, at least 1."""
    try:
        per_cpu, cap = WORKER_DEFAULTS[kind]
    except KeyError:
        raise ConfigError(
            f"no default worker count for {kind!r}; one of {sorted(WORKER_DEFAULTS)}"
        ) from None
    return max(1, min(cap, per_cpu * usable_cpus()))
