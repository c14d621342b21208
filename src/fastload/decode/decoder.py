"""``Decoder``: a picklable sample decoder configured once and called per sample."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastload.decode.image import (
    RESIZE_MODES,
    RESIZERS,
    Size,
    _decode_hwc,
    _decode_image,
    _ImageOptions,
    _prepare_native,
    output_size,
    to_numpy,
    to_tensor,
)
from fastload.decode.labels import decode_label, label_to_numpy, label_to_tensor
from fastload.decode.masks import MASK_BACKENDS
from fastload.decode.targets import BOX_FORMATS, coco_targets
from fastload.errors import ConfigError, DecodeError

__all__ = ["IMAGE_EXTENSIONS", "LABEL_SUFFIXES", "Decoder"]

#: Field extensions decoded as images.
IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")
#: Field-name endings (lower case) decoded as label images: mode kept, NEAREST resize.
LABEL_SUFFIXES: tuple[str, ...] = (
    "labelids.png",
    "labeltrainids.png",
    "instanceids.png",
    "instancetrainids.png",
    "color.png",
    "seg.png",
)
_OUTPUTS = ("pil", "numpy", "tensor")
_TARGETS = ("raw", "tensor")


@dataclass(frozen=True)
class Decoder:
    """Decode the fields of a sample dict by their extension.

    ``image``: ``"pil"``, ``"numpy"`` (HWC uint8), ``"tensor"`` (uint8, ``layout``) or
    ``None`` to leave images and labels as bytes. ``size``/``resize``/``mode``/``draft``/
    ``resample`` as in :func:`~fastload.decode.decode_image`; ``resizer`` as in
    :func:`~fastload.decode.decode_tensor` (``"auto"``: tensors of RGB and L images
    are resized by torch's antialiased kernels, within one level of Pillow's and
    3-5x faster, or by Pillow-SIMD where it is the PIL in use; NumPy and PIL outputs
    by Pillow unless ``"torch"``); label images
    (``*labelIds.png``, ``*instanceIds.png``, ``*color.png``, ``*seg.png``) get the same
    size with NEAREST and keep their mode. ``json`` is parsed, ``cls`` becomes an int,
    ``txt`` a str, anything else stays ``bytes``. With ``targets="tensor"`` a COCO
    ``json`` (``{"image": ..., "annotations": [...]}``) also gives ``"target"``: the
    :func:`~fastload.decode.coco_targets` dict, scaled to the decoded image.

    A frozen dataclass, so it pickles into DataLoader workers. Raises
    :class:`ConfigError` for bad settings at construction.
    """

    image: str | None = "pil"
    size: Size | None = None
    resize: str = "shorter"
    mode: str | None = "RGB"
    draft: bool = True
    resample: str = "bilinear"
    layout: str = "CHW"
    resizer: str = "auto"
    targets: str = "raw"
    masks: bool = False
    box_format: str = "xyxy"
    label_map: Mapping[int, int] | None = field(default=None, hash=False)
    mask_backend: str = "auto"
    label_suffixes: tuple[str, ...] = LABEL_SUFFIXES
    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS

    def __post_init__(self) -> None:
        if self.image is not None and self.image not in _OUTPUTS:
            raise ConfigError(
                f"Decoder.image must be one of {_OUTPUTS} or None, got {self.image!r}"
            )
        if self.targets not in _TARGETS:
            raise ConfigError(f"Decoder.targets must be one of {_TARGETS}, got {self.targets!r}")
        if self.resize not in RESIZE_MODES:
            raise ConfigError(f"Decoder.resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        if self.box_format not in BOX_FORMATS:
            raise ConfigError(f"Decoder.box_format must be one of {BOX_FORMATS}")
        if self.mask_backend not in MASK_BACKENDS:
            raise ConfigError(f"Decoder.mask_backend must be one of {MASK_BACKENDS}")
        if self.layout not in ("CHW", "HWC"):
            raise ConfigError(f"Decoder.layout must be 'CHW' or 'HWC', got {self.layout!r}")
        if self.resizer not in RESIZERS:
            raise ConfigError(f"Decoder.resizer must be one of {RESIZERS}, got {self.resizer!r}")
        if self.resizer == "torch" and (
            self.mode not in ("RGB", "L") or self.resample not in ("bilinear", "bicubic")
        ):
            raise ConfigError(
                "Decoder(resizer='torch') resizes RGB and L images with the bilinear or "
                f"bicubic filter, not mode={self.mode!r} with resample={self.resample!r}; "
                "use resizer='auto'"
            )
        if isinstance(self.size, list):
            object.__setattr__(self, "size", tuple(self.size))
        output_size(64, 64, self.size, self.resize)
        object.__setattr__(self, "label_suffixes", tuple(s.lower() for s in self.label_suffixes))
        object.__setattr__(
            self, "image_extensions", tuple(e.lower().lstrip(".") for e in self.image_extensions)
        )
        if self._arrays and self.mode in ("RGB", "L"):
            _prepare_native()  # the native JPEG path's self-check, before workers fork

    def kind(self, field_name: str) -> str:
        """Return how ``field_name`` is decoded: ``"label"``, ``"image"``, ``"json"``,
        ``"cls"``, ``"txt"`` or ``"bytes"``."""
        lower = field_name.lower()
        if lower.endswith(self.label_suffixes):
            return "label"
        ext = lower.rsplit(".", 1)[-1]
        if ext in self.image_extensions:
            return "image"
        if ext in ("json", "cls", "txt"):
            return ext
        return "bytes"

    def _image_options(self, name: str) -> _ImageOptions:
        """The decode settings an image field is decoded with (``name`` for errors)."""
        return _ImageOptions(self.size, self.mode, self.resize, self.draft, self.resample, name)

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """Decode ``sample`` (``{"__key__": str, field: bytes | memoryview, ...}``).

        Returns a new dict with the same keys (plus ``"target"`` for tensor targets).
        Raises :class:`DecodeError` naming the sample key and field.
        """
        key = str(sample.get("__key__", "?"))
        out: dict[str, Any] = {}
        original: tuple[int, int] | None = None  # (width, height) before resizing
        decoded: tuple[int, int] | None = None
        annotations: Any = None  # the parsed COCO json (dict or list of annotations)
        for name, value in sample.items():
            if name.startswith("__"):
                out[name] = value
                continue
            what = self.kind(name)
            label = f"{key}.{name}"
            if what == "image" and self._arrays:
                hwc, orig = _decode_hwc(value, self._image_options(label), resizer=self.resizer)
                if original is None:
                    original, decoded = orig, (int(hwc.shape[1]), int(hwc.shape[0]))
                if self.image == "numpy":
                    out[name] = hwc.numpy()
                else:
                    out[name] = hwc.permute(2, 0, 1) if self.layout == "CHW" else hwc
            elif what == "image" and self.image is not None:
                img, orig = _decode_image(value, self._image_options(label))
                if original is None:
                    original, decoded = orig, img.size
                out[name] = self._image_output(img)
            elif what == "label" and self.image is not None:
                limg = decode_label(value, size=self.size, resize=self.resize, name=label)
                out[name] = (
                    limg
                    if self.image == "pil"
                    else label_to_numpy(limg)
                    if self.image == "numpy"
                    else label_to_tensor(limg)
                )
            elif what == "json":
                out[name] = _parse_json(value, label)
                if annotations is None and _is_coco(out[name]):
                    annotations = out[name]
            elif what == "cls":
                out[name] = _parse_cls(value, label)
            elif what == "txt":
                out[name] = _text(value, label)
            else:
                out[name] = value if isinstance(value, (bytes, str)) else bytes(value)
        if self.targets == "tensor" and annotations is not None:
            out["target"] = self._target(annotations, original, decoded, key)
        return out

    @property
    def _arrays(self) -> bool:
        # images decoded through torch (its resize): tensors unless resizer="pil",
        # NumPy arrays only with resizer="torch"
        if self.image == "tensor":
            return self.resizer != "pil"
        return self.image == "numpy" and self.resizer == "torch"

    def _image_output(self, img: Any) -> Any:
        if self.image == "numpy":
            return to_numpy(img)
        if self.image == "tensor":
            return to_tensor(img, self.layout)
        return img

    def _target(
        self,
        parsed: Any,
        original: tuple[int, int] | None,
        decoded: tuple[int, int] | None,
        key: str,
    ) -> dict[str, Any]:
        info = parsed.get("image", {}) if isinstance(parsed, dict) else {}
        anns = parsed["annotations"] if isinstance(parsed, dict) else parsed
        if original is not None:
            width, height = original
        elif "width" in info and "height" in info:
            width, height = int(info["width"]), int(info["height"])
        else:
            raise DecodeError(
                f"cannot build targets of {key!r}: they need the image size, and there is "
                "no decoded image and no image width/height in the json"
            )
        out_size = None if decoded is None else (decoded[1], decoded[0])
        image_id = info.get("id") if isinstance(info, dict) else None
        return coco_targets(
            anns,
            height=height,
            width=width,
            image_id=None if image_id is None else int(image_id),
            out_size=out_size,
            box_format=self.box_format,
            label_map=self.label_map,
            masks=self.masks,
            mask_backend=self.mask_backend,
            name=key,
        )


def _is_coco(parsed: Any) -> bool:
    if isinstance(parsed, dict):
        return isinstance(parsed.get("annotations"), list)
    return (
        isinstance(parsed, list)
        and bool(parsed)
        and all(isinstance(a, dict) and "bbox" in a for a in parsed)
    )


def _text(value: Any, label: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"cannot decode {label!r}: not UTF-8 text at byte {e.start}") from e


def _parse_json(value: Any, label: str) -> Any:
    try:
        return json.loads(_text(value, label))
    except json.JSONDecodeError as e:
        raise DecodeError(
            f"cannot decode {label!r}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from e


def _parse_cls(value: Any, label: str) -> int:
    text = _text(value, label).strip()
    try:
        return int(text)
    except ValueError as e:
        raise DecodeError(
            f"cannot decode {label!r}: a class must be an integer, got {text[:40]!r}"
        ) from e
