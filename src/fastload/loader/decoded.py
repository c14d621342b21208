"""Decoding a worker's batch straight into its shared-memory batch tensor.

With built-in CPU decoding in DataLoader worker processes, each worker fetches a whole
batch (torch's ``__getitems__``); when every image of the batch decodes to one fixed
shape (``decode="tensor"`` with ``resize="exact"`` and an RGB or L mode: what
``ShardedDataset(decode="tensor", size=224)`` makes), :func:`decode_batch` allocates
one ``(N, H, W, C)`` uint8 tensor per image field in shared memory and decodes each
image into its slot (:func:`fastload.decode.decode_tensor` with ``out=``). The
samples it returns hold views of those slots, so they are exactly what
``dataset[i]`` gives, and :func:`~fastload.loader.transport.collate_decoded` hands the
batch tensors on as they are: the pixels are written once, into the memory the
loader's process maps, not decoded into a heap buffer and then copied into the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from fastload.decode import Decoder, decode_tensor, output_size

__all__ = ["DecodedItems", "decode_batch", "fixed_image_shape"]


class DecodedItems(list[Any]):
    """A batch's decoded samples (a list, as torch's fetcher passes it to the collate),
    with ``batches``: ``{field: (N, H, W, C) uint8 tensor}`` whose slot ``k`` each
    sample ``k``'s image of that field is a view of."""

    batches: dict[str, torch.Tensor]


def fixed_image_shape(decoder: Any) -> tuple[int, int, int] | None:
    """The ``(H, W, C)`` every image field of ``decoder`` decodes to, or None where it
    depends on the image (or the decoder is not fastload's tensor ``Decoder`` without
    targets built from the image's size)."""
    if not isinstance(decoder, Decoder) or decoder.image != "tensor":
        return None
    if decoder.targets != "raw" or decoder.resize != "exact" or decoder.size is None:
        return None
    if decoder.mode not in ("RGB", "L"):
        return None
    width, height = output_size(1, 1, decoder.size, "exact")
    return height, width, 3 if decoder.mode == "RGB" else 1


def decode_batch(
    samples: Sequence[Mapping[str, Any]],
    decoder: Decoder,
    alloc: Callable[[tuple[int, ...]], torch.Tensor],
    mapper: Callable[[Callable[[int], Any], range], Iterable[Any]] = map,
) -> list[Any]:
    """``[decoder(s) for s in samples]``, the images of one fixed shape
    (:func:`fixed_image_shape`) decoded into slots of one ``alloc((N, H, W, C))``
    tensor per image field (a :class:`DecodedItems`). Samples whose image fields
    differ from the first's are decoded one by one (a plain list). ``mapper``
    (``map``, or an executor's) runs the per-sample work, in the samples' order."""
    shape = fixed_image_shape(decoder)
    if shape is None or not samples:
        return list(mapper(lambda k: decoder(dict(samples[k])), range(len(samples))))
    fields = [n for n in samples[0] if not n.startswith("__") and decoder.kind(n) == "image"]
    wanted = set(fields)
    for s in samples:
        if {n for n in s if not n.startswith("__") and decoder.kind(n) == "image"} != wanted:
            return list(mapper(lambda k: decoder(dict(samples[k])), range(len(samples))))
    batches = {name: alloc((len(samples), *shape)) for name in fields}
    chw = decoder.layout == "CHW"

    def one(k: int) -> dict[str, Any]:
        sample = samples[k]
        key = str(sample.get("__key__", "?"))
        out = decoder({n: v for n, v in sample.items() if n not in wanted})
        for name in fields:
            slot = batches[name][k]
            decode_tensor(
                sample[name],
                size=decoder.size,
                mode=decoder.mode,
                resize="exact",
                draft=decoder.draft,
                resample=decoder.resample,
                name=f"{key}.{name}",
                layout="HWC",
                resizer=decoder.resizer,
                out=slot,
            )
            out[name] = slot.permute(2, 0, 1) if chw else slot
        # the fields in the sample's own order, as the decoder gives them
        return {n: out[n] for n in sample if n in out} | out

    items = DecodedItems(mapper(one, range(len(samples))))
    items.batches = batches
    return items
