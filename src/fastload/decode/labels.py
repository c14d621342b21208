"""Label images (Cityscapes ``labelIds``/``instanceIds``/``color`` PNGs, ``seg.png`` masks).

Decoded exactly as ``PIL.Image.open`` gives them (torchvision's ``Cityscapes`` returns
``Image.open(path)`` for targets): the mode is kept — ``L`` for label ids, ``I;16``
(or ``I``) for instance ids, ``RGBA`` for colour — and a resize uses NEAREST, so no
label value is ever blended into one that does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastload.decode._deps import pil_image, torch_module
from fastload.decode.image import Size, _explain, open_image, output_size
from fastload.errors import ConfigError, DecodeError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image as PILImage

__all__ = ["decode_label", "label_to_numpy", "label_to_tensor"]

# Integer label modes (after Image.open of a 16- or 32-bit PNG/TIFF): widened to int64.
_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "I;32", "I;32B", "I;32L")


def decode_label(
    data: bytes | bytearray | memoryview,
    *,
    size: Size | None = None,
    resize: str = "shorter",
    name: str | None = None,
) -> PILImage.Image:
    """Decode a label image keeping its mode; resize it with NEAREST if ``size`` is given.

    ``size``/``resize`` as in :func:`fastload.decode.decode_image` (so an image and its
    label given the same arguments come out the same size). Returns the PIL image.
    Raises :class:`DecodeError` naming ``name`` for data that is not a whole image.
    """
    image = pil_image()
    output_size(64, 64, size, resize)  # argument errors before data errors
    try:
        img = open_image(data, name=name)[0]
    except DecodeError as e:
        label = f"label image {name!r}" if name else "label image"
        cause = e.__cause__ or e
        raise DecodeError(f"cannot decode {label}: {_explain(cause)}") from cause
    if size is not None:
        target = output_size(img.width, img.height, size, resize)
        if target != img.size:
            img = img.resize(target, image.Resampling.NEAREST)
    return img


def label_to_numpy(img: PILImage.Image) -> np.ndarray:
    """Return a label image as a writable numpy array.

    ``L``/``P`` (class ids, palette indices) give ``uint8 (H, W)``; 16/32-bit integer
    modes (instance ids such as 26001) give ``int64 (H, W)``; ``RGB``/``RGBA`` (colour)
    give ``uint8 (H, W, C)``. Raises :class:`ConfigError` for other modes.
    """
    if img.mode in ("L", "P", "1"):
        return np.array(img, dtype=np.uint8)
    if img.mode in _WIDE_MODES:
        return np.asarray(img).astype(np.int64)
    if img.mode in ("RGB", "RGBA", "LA"):
        return np.array(img, dtype=np.uint8)
    raise ConfigError(f"label_to_numpy: unsupported label image mode {img.mode!r}")


def label_to_tensor(img: PILImage.Image) -> torch.Tensor:
    """Return :func:`label_to_numpy` of ``img`` as a torch tensor sharing its memory.

    Raises :class:`MissingDependencyError` without torch.
    """
    torch = torch_module()
    return torch.from_numpy(label_to_numpy(img))
