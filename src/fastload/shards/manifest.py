"""The dataset manifest (``manifest.json`` at the dataset root).

It is the one file read at start-up: the shard list with sizes, sample counts and
checksums of every shard and its index sidecar, the fields present, totals, and the
source's metadata (COCO categories, Cityscapes label ids, folder classes). Time to
first batch therefore does not grow with listing the bucket.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.errors import ShardFormatError
from fastload.shards.checksum import xxh3_128

__all__ = [
    "FORMAT",
    "KINDS",
    "MANIFEST_NAME",
    "MIN_SAMPLE_BYTES",
    "VERSION",
    "Manifest",
    "ShardInfo",
    "check_index",
    "check_sample_count",
    "indexed_shard",
]

FORMAT = "fastload"
VERSION = 1
MANIFEST_NAME = "manifest.json"
_CHECKSUM_RE = re.compile(r"^xxh3_128:[0-9a-f]{32}$")
#: What the shards hold: ``"samples"`` (WebDataset samples, e.g. images; what a
#: manifest without ``kind`` means) or ``"tokens"`` (one token array + document
#: boundaries per shard, written by ``fastload.convert.text``).
KINDS = ("samples", "tokens")
_SHARD_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
#: Every sample of a tar shard takes at least one 512-byte member header.
MIN_SAMPLE_BYTES = 512


def check_sample_count(info: ShardInfo, where: str) -> None:
    """Refuse a shard whose sample count cannot fit in its bytes
    (``samples x 512 > bytes``): readers size per-sample tables from the counts before
    any shard is fetched. Raises :class:`ShardFormatError` naming ``where``."""
    if info.samples * MIN_SAMPLE_BYTES > info.bytes:
        raise ShardFormatError(
            f"{info.name}: {info.samples} samples cannot fit in {info.bytes} bytes (each "
            f"sample takes at least {MIN_SAMPLE_BYTES})",
            where,
        )


def check_index(info: ShardInfo, shard_size: int, num_samples: int, where: str) -> None:
    """Refuse an index that does not describe the manifest's shard ``info``: another
    shard's (valid) index would serve wrong or no samples. ``shard_size`` and
    ``num_samples`` are the index's. Raises :class:`ShardFormatError` naming ``where``."""
    if shard_size != info.bytes or num_samples != info.samples:
        raise ShardFormatError(
            f"the index describes a shard of {shard_size} bytes and {num_samples} samples, "
            f"but the manifest's {info.name} has {info.bytes} bytes and {info.samples} samples",
            where,
        )


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a dataset: its tar and its index sidecar, with sizes and checksums."""

    name: str
    bytes: int
    samples: int
    checksum: str
    index_name: str
    index_bytes: int
    index_checksum: str
    #: ``"gzip"`` when the object ``name`` is compressed; ``bytes``/``checksum`` then
    #: describe the decompressed tar (what the cache holds and the index describes)
    #: and ``compressed_bytes``/``compressed_checksum`` the object itself.
    compression: str = ""
    compressed_bytes: int = 0
    compressed_checksum: str = ""

    @classmethod
    def _checked(cls, values: dict[str, Any]) -> ShardInfo:
        """A ShardInfo from fields :func:`_shard_from_dict` has already checked, without
        the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field: a tenth
        of a second for a manifest of 10,000 shards)."""
        info = cls.__new__(cls)
        info.__dict__.update(_DEFAULTS, **values)
        return info

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest's JSON form of this shard."""
        out: dict[str, Any] = {
            "name": self.name,
            "bytes": self.bytes,
            "samples": self.samples,
            "checksum": self.checksum,
            "index": {
                "name": self.index_name,
                "bytes": self.index_bytes,
                "checksum": self.index_checksum,
            },
        }
        if self.compression:
            out["compressed"] = {
                "codec": self.compression,
                "bytes": self.compressed_bytes,
                "checksum": self.compressed_checksum,
            }
        return out


_DEFAULTS: dict[str, Any] = {"compression": "", "compressed_bytes": 0, "compressed_checksum": ""}


def indexed_shard(name: str, size: int, samples: int, checksum: str, index: bytes) -> ShardInfo:
    """The :class:`ShardInfo` of the tar ``name`` (``size`` bytes, ``samples`` samples,
    ``checksum``) whose sidecar ``name + ".idx"`` holds the serialised ``index``."""
    return ShardInfo(
        name=name,
        bytes=size,
        samples=samples,
        checksum=checksum,
        index_name=name + ".idx",
        index_bytes=len(index),
        index_checksum=xxh3_128(index),
    )


@dataclass(frozen=True)
class Manifest:
    """A dataset's manifest: shards, fields, totals and source metadata.

    ``url`` is the dataset root the manifest was read from (or written to); shard
    names are relative to it.
    """

    shards: tuple[ShardInfo, ...]
    fields: tuple[str, ...]
    source: Mapping[str, Any] = field(default_factory=dict)
    url: str = ""
    created_by: str = ""
    kind: str = "samples"

    # ------------------------------------------------------------------ derived
    @property
    def num_samples(self) -> int:
        """Total number of samples over all shards."""
        return int(sum(s.samples for s in self.shards))

    @property
    def total_bytes(self) -> int:
        """Total bytes of the shards (without index sidecars)."""
        return int(sum(s.bytes for s in self.shards))

    @functools.cached_property
    def sample_starts(self) -> np.ndarray:
        """Global index of each shard's first sample, plus the total at the end (int64,
        computed once; read-only)."""
        starts = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum([s.samples for s in self.shards], out=starts[1:])
        starts.flags.writeable = False
        return starts

    @functools.cached_property
    def _starts_list(self) -> list[int]:
        return [int(v) for v in self.sample_starts]

    def locate(self, i: int) -> tuple[int, int]:
        """Map global sample index ``i`` to ``(shard number, index within the shard)``
        in O(log shards) over the precomputed starts.

        Raises :class:`IndexError` when ``i`` is out of range (negative indices count
        from the end, as for a sequence).
        """
        starts = self._starts_list
        n = starts[-1]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range for {n} samples in {self.url}")
        s = bisect.bisect_right(starts, i) - 1
        return s, i - starts[s]

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable form of the manifest."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "created_by": self.created_by,
            "kind": self.kind,
            "shards": [s.to_dict() for s in self.shards],
            "fields": list(self.fields),
            "totals": {
                "shards": len(self.shards),
                "samples": self.num_samples,
                "bytes": self.total_bytes,
            },
            "source": dict(self.source),
        }

    def to_json(self) -> str:
        """Return the manifest as pretty-printed JSON text."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, url: str = "") -> Manifest:
        """Parse and validate manifest JSON read from ``url``.

        Raises :class:`ShardFormatError` naming ``url`` and the offending entry.
        """
        where = f"{url.rstrip('/')}/{MANIFEST_NAME}" if url else MANIFEST_NAME
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ShardFormatError(f"not valid JSON ({exc})", where) from None
        except RecursionError:
            raise ShardFormatError("JSON nested too deeply to be a manifest", where) from None
        return cls.from_dict(doc, url, where)

    @classmethod
    def from_dict(cls, doc: Any, url: str = "", where: str | None = None) -> Manifest:
        """Validate a decoded manifest document; see :meth:`from_json`."""
        where = where or url or MANIFEST_NAME
        if not isinstance(doc, dict):
            raise ShardFormatError("manifest must be a JSON object", where)
        if doc.get("format") != FORMAT:
            raise ShardFormatError(f"not a fastload manifest (format={doc.get('format')!r})", where)
        version = doc.get("version")
        if not isinstance(version, int) or version > VERSION or version < 1:
            raise ShardFormatError(
                f"manifest version {version!r} is not supported (this fastload reads "
                f"versions 1..{VERSION}; upgrade fastload)",
                where,
            )
        raw_shards = doc.get("shards")
        if not isinstance(raw_shards, list):
            raise ShardFormatError("'shards' must be a list", where)
        shards = tuple(_shard_from_dict(s, k, where) for k, s in enumerate(raw_shards))
        if doc.get("kind", "samples") == "samples":
            for k, s in enumerate(shards):
                if s.samples * MIN_SAMPLE_BYTES > s.bytes:  # the message only when it fails
                    check_sample_count(s, f"{where}: shards[{k}]")
        names = [s.name for s in shards]
        if len(set(names)) != len(names):
            raise ShardFormatError("shard names are not unique", where)
        fields = doc.get("fields", [])
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ShardFormatError("'fields' must be a list of strings", where)
        source = doc.get("source", {})
        if not isinstance(source, dict):
            raise ShardFormatError("'source' must be an object", where)
        kind = doc.get("kind", "samples")
        if kind not in KINDS:
            raise ShardFormatError(
                f"unknown shard kind {kind!r} (this fastload reads {', '.join(KINDS)})", where
            )
        manifest = cls(
            shards=shards,
            fields=tuple(fields),
            source=source,
            url=url,
            created_by=str(doc.get("created_by", "")),
            kind=kind,
        )
        totals = doc.get("totals")
        if isinstance(totals, dict):
            for key, actual in (
                ("shards", len(shards)),
                ("samples", manifest.num_samples),
                ("bytes", manifest.total_bytes),
            ):
                if key in totals and totals[key] != actual:
                    raise ShardFormatError(
                        f"totals.{key} is {totals[key]!r} but the shards add up to {actual}", where
                    )
        return manifest

    @classmethod
    def load(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Manifest:
        """Read ``<url>/manifest.json`` through :mod:`fastload.storage` and validate it."""
        from fastload.storage import open_store

        store = open_store(url, storage_options)
        return cls.from_json(store.read(MANIFEST_NAME), url)

    @classmethod
    def build(
        cls,
        shards: Iterable[ShardInfo],
        fields: Iterable[str],
        source: Mapping[str, Any] | None = None,
        url: str = "",
        kind: str | None = None,
    ) -> Manifest:
        """Make a manifest for freshly written shards. ``kind`` defaults to
        ``"tokens"`` for a ``source`` of kind ``"tokens"``, else ``"samples"``."""
        from fastload import __version__

        source = dict(source or {})
        if kind is None:
            kind = "tokens" if source.get("kind") == "tokens" else "samples"
        return cls(
            shards=tuple(shards),
            fields=tuple(sorted(set(fields))),
            source=source,
            url=url,
            created_by=f"fastload {__version__}",
            kind=kind,
        )


def _shard_from_dict(raw: Any, k: int, where: str) -> ShardInfo:
    # Checked value by value before one ShardInfo is made: this runs once per shard when
    # a manifest is opened (10,000 shards: most of the time to the first sample).
    if not isinstance(raw, dict):
        raise ShardFormatError(f"shards[{k}] must be an object", where)
    index = raw.get("index")
    if not isinstance(index, dict):
        raise ShardFormatError(f"shards[{k}].index must be an object", where)
    try:
        values: dict[str, Any] = {
            "name": raw["name"],
            "bytes": raw["bytes"],
            "samples": raw["samples"],
            "checksum": raw["checksum"],
            "index_name": index["name"],
            "index_bytes": index["bytes"],
            "index_checksum": index["checksum"],
        }
    except KeyError as exc:
        raise ShardFormatError(f"shards[{k}] lacks {exc.args[0]!r}", where) from None
    compressed = raw.get("compressed")
    if compressed is not None:
        if not isinstance(compressed, dict) or compressed.get("codec") != "gzip":
            raise ShardFormatError(
                f"shards[{k}].compressed must be {{'codec': 'gzip', ...}}", where
            )
        try:
            values["compressed_bytes"] = compressed["bytes"]
            values["compressed_checksum"] = compressed["checksum"]
        except KeyError as exc:
            raise ShardFormatError(f"shards[{k}].compressed lacks {exc.args[0]!r}", where) from None
        values["compression"] = "gzip"
    for attr in ("name", "index_name"):
        value = values[attr]
        if (
            type(value) is not str
            or not _SHARD_NAME_RE.match(value)
            or not {"..", "."}.isdisjoint(value.split("/"))  # the path fastload writes
        ):
            raise ShardFormatError(f"shards[{k}]: bad {attr} {value!r}", where)
    for attr in ("bytes", "samples", "index_bytes", "compressed_bytes"):
        value = values.get(attr, 0)
        if type(value) is not int or value < 0:  # not a bool, a float or a string
            raise ShardFormatError(f"shards[{k}]: {attr} must be a non-negative integer", where)
    for attr in ("checksum", "index_checksum", "compressed_checksum"):
        if attr == "compressed_checksum" and compressed is None:
            continue
        value = values[attr]
        if type(value) is not str or not _CHECKSUM_RE.match(value):
            raise ShardFormatError(
                f"shards[{k}]: bad {attr} {value!r} (want xxh3_128:<hex>)", where
            )
    return ShardInfo._checked(values)
