"""JPEG decoding of whole batches on the GPU with nvJPEG (``torchvision.io.decode_jpeg``),
resized on the device.

:class:`NvjpegDecoder` takes a collated batch whose image fields are
:class:`~fastload.packed.PackedBytes` (what ``fastload.DataLoader`` yields for raw
fields) or lists of encoded images, and replaces each with the decoded images:
one batched ``decode_jpeg(list_of_uint8_tensors, device=...)`` call per field,
then :func:`resize_images` on the same device. Sizes follow the CPU path
(:func:`fastload.decode.output_size`: ``size`` is ``(height, width)`` or an int,
``resize`` ``"exact"``, ``"shorter"`` or ``"longer"``), and the resize is bilinear
with antialiasing, as Pillow's; ``tests/gpu/test_nvjpeg.py`` holds the outputs to
the CPU path's tolerances (those of draft-mode decoding, ``tests/decode``).

Outputs: with ``resize="exact"`` and a size, one ``uint8`` ``(N, C, H, W)`` tensor in
``channels_last`` memory format; otherwise a list of ``(C, H, W)`` tensors (None for
a sample without the field).

torchvision reads the encoded bytes from host memory even when it decodes on the
GPU (its own rule: inputs must be CPU tensors), so the image fields are best left
on the host, pinned, and given to the decoder there; a PackedBytes already on the
GPU is copied back first (one copy). ``device="cpu"`` runs torchvision's CPU
decoder through the same code (what CI tests where torchvision is installed).

A sample nvJPEG cannot decode (not a JPEG, a CMYK JPEG, ...) is decoded on the CPU
with Pillow when ``fallback`` is on (counted in ``fallbacks``); data no decoder
reads raises :class:`~fastload.errors.DecodeError` naming the field and sample.
torchvision is an optional dependency (extra ``gpu``), imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastload.decode._deps import torch_module
from fastload.decode.image import RESIZE_MODES, Size, decode_image, output_size, to_tensor
from fastload.errors import ConfigError, DecodeError, MissingDependencyError
from fastload.packed import PackedBytes

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["NvjpegDecoder", "image_extension_problem", "resize_images", "torchvision_io"]

_MODES = ("RGB", "L")


def torchvision_io() -> Any:
    """Return ``torchvision.io``; raises :class:`MissingDependencyError` (extra ``gpu``)
    when torchvision is missing or cannot load beside this torch (its error chained),
    or when it imports but its image extension, which holds ``decode_jpeg``, does not
    load (:func:`image_extension_problem`)."""
    try:
        import torchvision.io
    except (ImportError, RuntimeError, OSError) as exc:
        # RuntimeError/OSError: a torchvision built for another torch ("operator
        # torchvision::nms does not exist") or missing CUDA libraries
        raise MissingDependencyError("torchvision", "gpu", "nvJPEG decoding") from exc
    problem = image_extension_problem()
    if problem is not None:
        raise MissingDependencyError("torchvision", "gpu", f"nvJPEG decoding ({problem})")
    return torchvision.io


_PROBED: list[str | None] = []  # this process's verdict, once probed


def image_extension_problem() -> str | None:
    """Why ``torchvision.io.decode_jpeg`` cannot run here, or None when it can.

    torchvision may import while its image extension does not load (its ops and the
    image library are separate, and a wheel built for another torch loads neither);
    ``decode_jpeg`` then fails on every call, so this decodes one tiny JPEG on the
    CPU, once per process, and names what failed. Raises
    :class:`MissingDependencyError` when torchvision itself does not import.
    """
    if _PROBED:
        return _PROBED[0]
    try:
        import torchvision
        import torchvision.io
    except (ImportError, RuntimeError, OSError) as exc:
        raise MissingDependencyError("torchvision", "gpu", "nvJPEG decoding") from exc
    torch = torch_module()
    data = torch.frombuffer(bytearray(_TINY_JPEG), dtype=torch.uint8)
    problem: str | None = None
    try:
        torchvision.io.decode_jpeg(data)
    except RuntimeError as exc:
        problem = (
            f"torchvision {torchvision.__version__} imports, but torchvision.io's image "
            f"extension does not load beside torch {torch.__version__}: {exc}"
        )
    _PROBED.append(problem)
    return problem


# A 1x1 grey baseline JPEG (Pillow, quality 75): what the probe decodes.
_TINY_JPEG = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300080606070605080707070909080a0c"
    "140d0c0b0b0c1912130f141d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27"
    "393d38323c2e333432ffc0000b080001000101011100ffc4001f0000010501010101010100000000"
    "000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300"
    "041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a"
    "25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475"
    "767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9ba"
    "c2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda"
    "0008010100003f002bffd9"
)


def _interpolate(batch: torch.Tensor, h: int, w: int, in_float: bool) -> torch.Tensor:
    torch = torch_module()
    fn = torch.nn.functional
    if not in_float:  # torch's uint8 kernel (CPU only), made to match Pillow's
        return fn.interpolate(batch, size=(h, w), mode="bilinear", antialias=True)
    resized = fn.interpolate(
        batch.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=True
    )
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def resize_images(
    images: Sequence[torch.Tensor],
    size: Size | None,
    resize: str = "exact",
    *,
    in_float: bool | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """Resize ``(C, H, W)`` uint8 images to the sizes the CPU path gives
    (:func:`~fastload.decode.output_size`), on their own device.

    Bilinear with antialiasing (``torch.nn.functional.interpolate(..., antialias=True)``),
    which follows Pillow's filter: in float32 rounded back to uint8 on the GPU (CUDA
    has no uint8 kernel), on uint8 directly on the CPU (``in_float`` overrides). Images
    of the same shape are resized in one call. Returns one ``(N, C, H, W)`` tensor
    (``channels_last``) for ``resize="exact"`` with a size, else a list. Raises
    :class:`ConfigError` for a bad size, or images of different channel counts to stack.
    """
    torch = torch_module()
    output_size(64, 64, size, resize)  # validate before any work
    if size is None:
        return list(images)
    groups: dict[tuple[tuple[int, ...], tuple[int, int], Any], list[int]] = {}
    for i, t in enumerate(images):
        if t.ndim != 3 or t.dtype != torch.uint8:
            raise ConfigError(f"resize_images: image {i} is not a uint8 (C, H, W) tensor")
        target = output_size(int(t.shape[2]), int(t.shape[1]), size, resize)
        groups.setdefault((tuple(t.shape), target, t.device), []).append(i)
    if resize == "exact" and len(groups) == 1:  # one source size (one stack, no copies)
        (((shape, (w, h), device), _idx),) = groups.items()
        if (shape[1], shape[2]) == (h, w):
            batch = torch.stack(list(images))
        else:
            as_float = device.type != "cpu" if in_float is None else in_float
            batch = _interpolate(torch.stack(list(images)), h, w, as_float)
        return batch.contiguous(memory_format=torch.channels_last)
    out: list[Any] = [None] * len(images)
    for (shape, (w, h), device), idx in groups.items():
        if (shape[1], shape[2]) == (h, w):
            for i in idx:
                out[i] = images[i]
            continue
        batch = torch.stack([images[i] for i in idx])
        as_float = device.type != "cpu" if in_float is None else in_float
        resized = _interpolate(batch, h, w, as_float)
        for j, i in enumerate(idx):
            out[i] = resized[j]
    if resize != "exact":
        return out
    channels = {int(t.shape[0]) for t in out}
    if len(channels) > 1:
        raise ConfigError(f"resize_images: cannot stack images of {sorted(channels)} channels")
    if not out:
        return torch.empty((0, 0, 0, 0), dtype=torch.uint8)
    h, w = int(out[0].shape[1]), int(out[0].shape[2])
    stacked = torch.empty(
        (len(out), channels.pop(), h, w),
        dtype=torch.uint8,
        device=out[0].device,
        memory_format=torch.channels_last,
    )
    for i, t in enumerate(out):
        stacked[i].copy_(t)
    return stacked


class NvjpegDecoder:
    """Decode the JPEG fields of a collated batch on ``device`` (see the module docstring).

    ``size``: None (keep each image's size), an int or ``(height, width)``;
    ``resize``: ``"exact"`` (stack into ``(N, C, H, W)``), ``"shorter"`` or ``"longer"``
    (a list, aspect kept); ``fields``: the field extensions decoded (``"jpg"`` matches
    ``"jpg"`` and ``"x.jpg"``); ``device``: ``"cuda"`` (the current device), ``"cuda:N"``
    or ``"cpu"``; ``mode``: ``"RGB"`` or ``"L"``; ``fallback``: decode what nvJPEG
    refuses with Pillow on the CPU instead of raising.

    Raises :class:`ConfigError` for bad settings (at construction) or a field that holds
    something other than encoded images, :class:`DecodeError` for undecodable data or a
    missing image where a stacked batch needs one, :class:`MissingDependencyError`
    without torchvision (on first call).
    """

    def __init__(
        self,
        size: Size | None = None,
        fields: Sequence[str] = ("jpg", "jpeg"),
        device: Any = "cuda",
        resize: str = "exact",
        *,
        mode: str = "RGB",
        fallback: bool = True,
    ) -> None:
        if resize not in RESIZE_MODES:
            raise ConfigError(f"NvjpegDecoder: resize must be one of {RESIZE_MODES}")
        if isinstance(size, list):
            size = tuple(size)
        output_size(64, 64, size, resize)
        if mode not in _MODES:
            raise ConfigError(f"NvjpegDecoder: mode must be one of {_MODES}, got {mode!r}")
        if isinstance(fields, str):
            fields = (fields,)
        self.size = size
        self.resize = resize
        self.fields = tuple(f.lower().lstrip(".") for f in fields)
        self.mode = mode
        self.fallback = fallback
        self._device_arg = device
        self._device: Any = None
        #: samples decoded by Pillow because nvJPEG refused them
        self.fallbacks = 0
        #: images decoded
        self.decoded = 0

    @property
    def stacks(self) -> bool:
        """Whether image fields come out as one ``(N, C, H, W)`` tensor."""
        return self.size is not None and self.resize == "exact"

    @property
    def device(self) -> torch.device:
        """The device images are decoded on (``"cuda"`` resolved on first use)."""
        if self._device is None:
            torch = torch_module()
            dev = torch.device(self._device_arg)
            if dev.type == "cuda":
                if not torch.cuda.is_available():
                    raise ConfigError(f"NvjpegDecoder: device {str(dev)!r} but CUDA is unavailable")
                if dev.index is None:
                    dev = torch.device("cuda", torch.cuda.current_device())
            elif dev.type != "cpu":
                raise ConfigError(f"NvjpegDecoder: device must be CUDA or the CPU, got {dev}")
            self._device = dev
        return self._device

    def matches(self, name: str) -> bool:
        """Whether the batch field ``name`` is decoded."""
        return not name.startswith("__") and name.lower().rsplit(".", 1)[-1] in self.fields

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A new dict: ``batch`` with each image field decoded (other fields as they are)."""
        out = dict(batch)
        keys = batch.get("__key__")
        for name, value in batch.items():
            if self.matches(name):
                out[name] = self.decode_field(value, name, keys)
        return out

    # ----------------------------------------------------------------- decode
    def decode_field(
        self, value: Any, name: str = "jpg", keys: Sequence[str] | None = None
    ) -> torch.Tensor | list[Any]:
        """Decode one field's batch (PackedBytes or a list of encoded images)."""
        torch = torch_module()
        items = self._host_items(value, name)
        labels = [self._label(name, keys, i) for i in range(len(items))]
        present: list[int] = []
        encoded: list[Any] = []
        for i, t in enumerate(items):
            if t is not None and t.numel() > 0:
                present.append(i)
                encoded.append(t)
            elif self.stacks:
                raise DecodeError(f"cannot decode {labels[i]}: the sample has no image data")
        decoded = self._decode(encoded, [labels[i] for i in present])
        self.decoded += len(decoded)
        if self.stacks:
            if not decoded:  # an empty batch
                channels = 3 if self.mode == "RGB" else 1
                return torch.empty(
                    (0, channels, *self._hw()), dtype=torch.uint8, device=self.device
                )
            return resize_images(decoded, self.size, self.resize)
        resized = resize_images(decoded, self.size, self.resize)
        result: list[Any] = [None] * len(items)
        for i, img in zip(present, resized, strict=True):
            result[i] = img
        return result

    def _hw(self) -> tuple[int, int]:
        w, h = output_size(1, 1, self.size, self.resize)
        return h, w

    @staticmethod
    def _label(name: str, keys: Sequence[str] | None, i: int) -> str:
        if keys is not None and not isinstance(keys, (str, bytes)) and i < len(keys):
            return f"field {name!r} of sample {keys[i]!r}"
        return f"field {name!r} of batch item {i}"

    def _host_items(self, value: Any, name: str) -> list[Any]:
        """The encoded images as 1-D uint8 CPU tensors (torchvision reads them there);
        None for a missing one."""
        torch = torch_module()
        if isinstance(value, PackedBytes):
            packed = value if value.device.type == "cpu" else value.to("cpu")
            missing = set(packed.missing)
            return [None if i in missing else t for i, t in enumerate(packed.tensors())]
        if isinstance(value, (list, tuple)):
            items: list[Any] = []
            for v in value:
                if v is None:
                    items.append(None)
                elif isinstance(v, torch.Tensor):
                    if v.dtype != torch.uint8:
                        raise ConfigError(
                            f"NvjpegDecoder: field {name!r} holds {v.dtype} tensors, "
                            "expected encoded bytes (uint8)"
                        )
                    items.append(v.reshape(-1).cpu())
                elif isinstance(v, (bytes, bytearray, memoryview)) or hasattr(v, "__array__"):
                    items.append(None)  # packed below, in one buffer
                else:
                    raise ConfigError(
                        f"NvjpegDecoder: field {name!r} holds {type(v).__name__}, "
                        "expected encoded images"
                    )
            raw = [
                i
                for i, (v, t) in enumerate(zip(value, items, strict=True))
                if t is None and v is not None
            ]
            if raw:
                packed = PackedBytes.from_list([memoryview(value[i]).cast("B") for i in raw])
                for i, t in zip(raw, packed.tensors(), strict=True):
                    items[i] = t
            return items
        raise ConfigError(
            f"NvjpegDecoder: field {name!r} holds {type(value).__name__}, expected "
            "PackedBytes or a list of encoded images"
        )

    def _decode(self, items: list[torch.Tensor], labels: list[str]) -> list[torch.Tensor]:
        if not items:
            return []
        torch = torch_module()
        device = self.device
        io = torchvision_io()
        mode = io.ImageReadMode.RGB if self.mode == "RGB" else io.ImageReadMode.GRAY
        try:
            return list(io.decode_jpeg(items, mode=mode, device=device))
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            pass  # a batched call fails whole: find the culprit(s) one by one
        out = []
        for t, label in zip(items, labels, strict=True):
            try:
                out.append(io.decode_jpeg(t, mode=mode, device=device))
                continue
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as exc:
                if not self.fallback:
                    raise DecodeError(f"cannot decode {label} with nvJPEG: {exc}") from exc
            try:
                img = decode_image(t.numpy().tobytes(), mode=self.mode, draft=False)
            except DecodeError as exc:
                raise DecodeError(f"cannot decode {label}: {exc}") from exc
            out.append(to_tensor(img).contiguous().to(device))
            self.fallbacks += 1
        return out

    def __repr__(self) -> str:
        return (
            f"NvjpegDecoder(size={self.size!r}, fields={self.fields!r}, "
            f"device={self._device_arg!r}, resize={self.resize!r})"
        )
