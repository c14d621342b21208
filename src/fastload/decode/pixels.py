"""The deterministic part of an image decode, as stored pixels: :class:`PixelCache` (the
``pixel_cache=`` option of the datasets), :class:`PixelDecode` (a :class:`Decoder`'s
work split into "pixels of each image" and "the sample around them") and the pixel
shard format (:func:`write_pixel_shard`, :class:`PixelShardView`).

A pixel shard holds, for each of a run of samples of one source shard, its key, each image field
as ``(H, W, C)`` uint8 pixels exactly as the decoder would produce them (decode, JPEG
draft, the decoder's own resize, mode conversion; no random augmentation), and every
other field as its raw bytes (so a sample is served from the pixel shard alone).
Layout, little-endian::

    [field data ...][record table][JSON: keys, field names, settings][footer 32 B]

The footer is ``<table offset u64><records u64><JSON offset u64><magic 8 B>``; each
record is :data:`RECORD`. An image whose decode failed when the shard was built is a
record of kind ``BAD`` with no bytes: a reader decodes it afresh and so raises the same
:class:`~fastload.errors.DecodeError` a fresh decode raises (the tier never stores it).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

import numpy as np

from fastload.decode.decoder import Decoder, _is_coco
from fastload.decode.image import (
    _decode_hwc,
    _decode_image,
    _ImageOptions,
    open_image,
    output_size,
    to_numpy,
)
from fastload.errors import ConfigError, ShardFormatError
from fastload.shards.checksum import Xxh3Hasher
from fastload.storage.direct import write_piece

__all__ = [
    "BAD",
    "PIXELS",
    "RAW",
    "RECORD",
    "PixelCache",
    "PixelDecode",
    "PixelShardView",
    "pixel_cache_option",
    "write_pixel_shard",
]

#: Record kinds: a field's raw bytes, an image's pixels, an image that did not decode.
RAW, PIXELS, BAD = 0, 1, 2
RECORD = np.dtype(
    [
        ("sample", "<u4"),
        ("field", "<u2"),
        ("kind", "u1"),
        ("channels", "u1"),
        ("offset", "<u8"),
        ("nbytes", "<u8"),
        ("height", "<u4"),
        ("width", "<u4"),
        ("orig_width", "<u4"),
        ("orig_height", "<u4"),
    ]
)
_FOOTER = struct.Struct("<QQQ8s")
_MAGIC = b"FLPIXEL1"
FORMAT_VERSION = 1
_CHANNELS = {"RGB": 3, "L": 1, "RGBA": 4}


@dataclass(frozen=True)
class PixelCache:
    """``pixel_cache=`` of :class:`~fastload.ShardedDataset` and
    :class:`~fastload.StreamingDataset`: keep each image's decoded pixels in the node
    cache (``cache_dir``) so that later epochs, processes and jobs read them instead of
    decoding. ``pixel_cache=True`` is ``PixelCache()``.

    ``max_side``: with ``size=None`` (full-size decodes, e.g. for a detection model's
    own resize), bound the stored images: one whose longer side is above ``max_side``
    is decoded (drafted) and resized to that longer side, aspect kept, as
    ``decode_image(size=max_side, resize="longer")`` gives; smaller ones are kept as
    they are. It applies to every sample, stored or not, so the output never depends on
    what the cache holds. With a ``size=`` the stored pixels are already that size and
    ``max_side`` is refused (:class:`ConfigError`).
    """

    max_side: int | None = None

    def __post_init__(self) -> None:
        side = self.max_side
        if side is not None and (isinstance(side, bool) or not isinstance(side, int) or side < 1):
            raise ConfigError(f"PixelCache max_side must be a positive int or None, got {side!r}")


def pixel_cache_option(value: Any) -> PixelCache | None:
    """Resolve a dataset's ``pixel_cache=`` (False/None: off, True: ``PixelCache()``)."""
    if value is None or value is False:
        return None
    if value is True:
        return PixelCache()
    if isinstance(value, PixelCache):
        return value
    raise ConfigError(f"pixel_cache= must be True, False or a fastload.PixelCache, got {value!r}")


@dataclass(frozen=True)
class PlannedImage:
    """What decoding one image will give: ``(height, width, channels)`` and the
    original ``(width, height)``."""

    height: int
    width: int
    channels: int
    original: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.height * self.width * self.channels


class PixelDecode:
    """A :class:`Decoder`'s work on a sample, split at the point the pixel tier stores:
    :meth:`pixels` (one image field to ``(H, W, C)`` uint8, deterministic) and
    :meth:`assemble` (the decoded sample from those pixels and the other fields' bytes,
    equal to ``decoder(sample)``). ``options.max_side`` bounds full-size decodes (see
    :class:`PixelCache`). Raises :class:`ConfigError` for a decoder whose output cannot
    be stored as 8-bit pixels (``image=None``, ``mode`` other than RGB, L, RGBA)."""

    def __init__(self, decoder: Decoder, options: PixelCache) -> None:
        if not isinstance(decoder, Decoder) or decoder.image is None:
            raise ConfigError(
                "pixel_cache needs decode='pil', 'numpy' or 'tensor' (or a fastload Decoder "
                f"with an image output); got {decoder!r}"
            )
        if decoder.mode not in _CHANNELS:
            raise ConfigError(
                f"pixel_cache stores 8-bit RGB, L or RGBA pixels; the decoder's mode is "
                f"{decoder.mode!r}"
            )
        if options.max_side is not None and decoder.size is not None:
            raise ConfigError(
                f"PixelCache(max_side={options.max_side}) bounds full-size decodes; with "
                f"size={decoder.size!r} the stored pixels are already that size"
            )
        self.decoder = decoder
        self.options = options
        self.channels = _CHANNELS[decoder.mode]
        self._arrays = (decoder.image == "tensor" and decoder.resizer != "pil") or (
            decoder.image == "numpy" and decoder.resizer == "torch"
        )
        self._rest = replace(decoder, targets="raw")

    # ------------------------------------------------------------- identity
    def settings(self) -> dict[str, Any]:
        """Everything the stored pixels depend on, including the libraries' versions
        (another Pillow or torch may round differently: then it is another entry)."""
        import PIL

        from fastload.decode.image import _pillow_simd

        d = self.decoder
        out: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "size": list(d.size) if isinstance(d.size, tuple) else d.size,
            "resize": d.resize,
            "mode": d.mode,
            "draft": d.draft,
            "resample": str(d.resample),
            "arrays": self._arrays,
            "resizer": d.resizer,
            "max_side": self.options.max_side,
            "image_extensions": list(d.image_extensions),
            "label_suffixes": list(d.label_suffixes),
            "pillow": str(PIL.__version__),
            "pillow_simd": _pillow_simd(),
        }
        if self._arrays:
            import torch

            out["torch"] = str(torch.__version__).split("+")[0]
        return out

    def fingerprint(self) -> str:
        """16 hex digits naming :meth:`settings`."""
        text = json.dumps(self.settings(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- pixels
    def is_image(self, field: str) -> bool:
        """Whether ``field`` is an image field whose pixels are stored."""
        return self.decoder.kind(field) == "image"

    def _opts(self, label: str, original: tuple[int, int] | None) -> _ImageOptions:
        d = self.decoder
        size, resize = d.size, d.resize
        side = self.options.max_side
        if side is not None and original is not None and max(original) > side:
            size, resize = side, "longer"
        return _ImageOptions(size, d.mode, resize, d.draft, d.resample, label)

    def plan(self, data: Any, label: str) -> PlannedImage:
        """The shape decoding ``data`` will give, from its header only. Raises
        :class:`DecodeError` for an unreadable header."""
        _, original, _ = open_image(data, name=label, load=False)
        w, h = output_size(*original, *self._size_for(original))
        return PlannedImage(h, w, self.channels, (int(original[0]), int(original[1])))

    def _size_for(self, original: tuple[int, int]) -> tuple[Any, str]:
        o = self._opts("", original)
        return o.size, o.resize

    @property
    def fixed_shape(self) -> tuple[int, int, int] | None:
        """The ``(H, W, C)`` of every image when the decoder resizes to an exact size
        (the same whatever the image), else None."""
        d = self.decoder
        if d.size is None or d.resize != "exact":
            return None
        width, height = output_size(1, 1, d.size, "exact")
        return height, width, self.channels

    def pixels(
        self, data: Any, label: str, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, tuple[int, int]]:
        """Decode one image field as the decoder does, up to its ``(H, W, C)`` uint8
        pixels; returns them and the original ``(width, height)``. ``out``: an array
        of :attr:`fixed_shape` the pixels are written into (and returned), where the
        decoder resizes with torch's kernels (a buffer reused image after image: no
        fresh pages each); ignored otherwise. Raises :class:`DecodeError` naming
        ``label``."""
        original = None
        if self.options.max_side is not None:
            original = open_image(data, name=label, load=False)[1]
        opts = self._opts(label, original)
        if self._arrays:
            import torch

            into = None if out is None else torch.from_numpy(out)
            hwc, orig = _decode_hwc(data, opts, resizer=self.decoder.resizer, out=into)
            return np.ascontiguousarray(hwc.numpy()), orig
        img, orig = _decode_image(data, opts)
        return to_numpy(img), orig

    def output(self, arr: np.ndarray) -> Any:
        """The decoder's output for an image whose pixels are ``arr``."""
        d = self.decoder
        if d.image == "numpy":
            return arr
        if d.image == "tensor":
            import torch

            t = torch.from_numpy(arr)
            return t.permute(2, 0, 1) if d.layout == "CHW" else t
        from PIL import Image

        return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr, mode=d.mode)

    def assemble(
        self, key: str, fields: Iterable[tuple[str, Any]], images: dict[str, Any]
    ) -> dict[str, Any]:
        """The decoded sample ``key``: ``fields`` are ``(name, raw bytes)`` of its
        non-image fields and ``images`` maps each image field to ``(pixels, original
        (width, height))``; ``order`` of the output follows ``fields`` then images as
        the sample had them (``fields`` must list every field, images with None)."""
        pairs = list(fields)
        rest = {"__key__": key, **{n: v for n, v in pairs if n not in images}}
        decoded = self._rest(rest)
        out: dict[str, Any] = {"__key__": key}
        original: tuple[int, int] | None = None
        size: tuple[int, int] | None = None
        for name, _ in pairs:
            if name in images:
                arr, orig = images[name]
                if original is None:
                    original, size = orig, (int(arr.shape[1]), int(arr.shape[0]))
                out[name] = self.output(arr)
            else:
                out[name] = decoded[name]
        if self.decoder.targets == "tensor":
            annotations = next(
                (decoded[n] for n, _ in pairs if n not in images and _is_coco(decoded[n])), None
            )
            if annotations is not None:
                out["target"] = self.decoder._target(annotations, original, size, key)
        return out

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode a raw sample afresh (what a tier miss does): equal to the decoder's
        output, with ``max_side`` applied."""
        key = str(sample.get("__key__", "?"))
        pairs = [(n, v) for n, v in sample.items() if not n.startswith("__")]
        images = {n: self.pixels(v, f"{key}.{n}") for n, v in pairs if self.is_image(n)}
        return self.assemble(key, pairs, images)


# ------------------------------------------------------------------ the file format
@dataclass
class ShardPlan:
    """The records of one pixel shard, planned before anything is decoded."""

    keys: list[str]
    names: list[str]
    records: np.ndarray  # of RECORD

    def data_bytes(self) -> int:
        last = self.records[-1] if self.records.size else None
        return 0 if last is None else int(last["offset"] + last["nbytes"])

    def meta(self, settings: dict[str, Any]) -> bytes:
        return json.dumps({"keys": self.keys, "fields": self.names, "settings": settings}).encode()

    def file_bytes(self, settings: dict[str, Any]) -> int:
        return self.data_bytes() + self.records.nbytes + len(self.meta(settings)) + _FOOTER.size


def write_pixel_shard(
    f: BinaryIO,
    plan: ShardPlan,
    settings: dict[str, Any],
    content: Callable[[int], Any],
) -> Xxh3Hasher:
    """Write a pixel shard into ``f``: ``content(r)`` gives record ``r``'s bytes (None:
    the image did not decode; its record becomes ``BAD`` and its bytes zeros, so the
    planned size holds). Returns the hasher fed every byte written."""
    digest = Xxh3Hasher()
    # in pieces: the page cache sizes its folios by the write, and large ones cost up to
    # ~10x the CPU per byte where the kernel reports free pages (see write_piece)
    step = write_piece()

    def put(data: Any) -> None:
        view = memoryview(data).cast("B")
        for at in range(0, view.nbytes, step):
            f.write(view[at : at + step])
        digest.update(view)

    records = plan.records
    for r in range(records.size):
        want = int(records[r]["nbytes"])
        data = content(r)
        if data is None or memoryview(data).nbytes != want:
            records[r]["kind"] = BAD
            if want:
                put(bytes(want))
            continue
        if want:
            put(data)
    table_at = plan.data_bytes()
    put(records.tobytes())
    json_at = table_at + records.nbytes
    put(plan.meta(settings))
    put(_FOOTER.pack(table_at, records.size, json_at, _MAGIC))
    return digest


class PixelShardView:
    """A pixel shard read from ``buffer`` (a read-only mapping): :meth:`sample` gives
    one sample's records. Raises :class:`ShardFormatError` naming ``name`` when the
    buffer is not a pixel shard."""

    def __init__(self, buffer: Any, name: str) -> None:
        self.buffer = buffer
        self.name = name
        view = memoryview(buffer)
        if view.nbytes < _FOOTER.size:
            raise ShardFormatError(f"{name}: too short for a pixel shard")
        table_at, count, json_at, magic = _FOOTER.unpack(view[view.nbytes - _FOOTER.size :])
        end = view.nbytes - _FOOTER.size
        if magic != _MAGIC or table_at + count * RECORD.itemsize != json_at or json_at > end:
            raise ShardFormatError(f"{name}: not a fastload pixel shard (bad footer)")
        self.records = np.frombuffer(buffer, RECORD, count=count, offset=table_at)
        meta = json.loads(bytes(view[json_at:end]))
        self.keys: list[str] = meta["keys"]
        self.names: list[str] = meta["fields"]
        self.starts = np.searchsorted(
            self.records["sample"], np.arange(len(self.keys) + 1, dtype=np.uint32)
        )

    def __len__(self) -> int:
        return len(self.keys)

    def sample(self, j: int) -> tuple[str, np.ndarray]:
        """Sample ``j``'s key and records."""
        return self.keys[j], self.records[int(self.starts[j]) : int(self.starts[j + 1])]

    def field(self, rec: Any, *, copy: bool = True) -> Any:
        """A record's content: a fresh ``(H, W, C)`` array for pixels (with
        ``copy=False`` a read-only view of the buffer, for a caller that only reads it
        before returning), bytes for a raw field, None for a ``BAD`` image."""
        kind, offset, nbytes = int(rec["kind"]), int(rec["offset"]), int(rec["nbytes"])
        if kind == PIXELS:
            arr = np.frombuffer(self.buffer, np.uint8, count=nbytes, offset=offset)
            shape = (int(rec["height"]), int(rec["width"]), int(rec["channels"]))
            return arr.reshape(shape).copy() if copy else arr.reshape(shape)
        if kind == RAW:
            return bytes(memoryview(self.buffer)[offset : offset + nbytes])
        return None
