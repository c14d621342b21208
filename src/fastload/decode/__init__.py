"""Decoding of sample fields: images (Pillow / Pillow-SIMD, JPEG draft mode; region and
scale decode of crops through libjpeg-turbo, :func:`decode_crop`), label images, COCO
detection targets, and the :class:`Decoder` that applies them by field.

Importing this package needs only numpy; Pillow (extra ``image``), torch (tensor
outputs) and pycocotools (optional mask backend) are imported when first used.
"""

from __future__ import annotations

from fastload.decode.backend import backend_info
from fastload.decode.crop import CROP_DECODERS, crop_decoder, crop_scale, decode_crop, image_size
from fastload.decode.crop_sample import (
    CropDecoder,
    FixedCrop,
    RandomPatch,
    RandomResizedCrop,
    Tiles,
)
from fastload.decode.decoder import IMAGE_EXTENSIONS, LABEL_SUFFIXES, Decoder
from fastload.decode.image import (
    IMAGE_FORMATS,
    RESIZE_MODES,
    RESIZERS,
    decode_image,
    decode_tensor,
    open_image,
    output_size,
    to_numpy,
    to_tensor,
)
from fastload.decode.labels import decode_label, label_to_numpy, label_to_tensor
from fastload.decode.masks import (
    MASK_BACKENDS,
    decode_rle,
    polygon_to_mask,
    rle_from_string,
    rle_to_string,
    segmentation_to_mask,
)
from fastload.decode.targets import BOX_FORMATS, category_map, coco_targets

__all__ = [
    "BOX_FORMATS",
    "CROP_DECODERS",
    "IMAGE_EXTENSIONS",
    "IMAGE_FORMATS",
    "LABEL_SUFFIXES",
    "MASK_BACKENDS",
    "RESIZERS",
    "RESIZE_MODES",
    "CropDecoder",
    "Decoder",
    "FixedCrop",
    "RandomPatch",
    "RandomResizedCrop",
    "Tiles",
    "backend_info",
    "category_map",
    "coco_targets",
    "crop_decoder",
    "crop_scale",
    "decode_crop",
    "decode_image",
    "decode_label",
    "decode_rle",
    "decode_tensor",
    "image_size",
    "label_to_numpy",
    "label_to_tensor",
    "open_image",
    "output_size",
    "polygon_to_mask",
    "rle_from_string",
    "rle_to_string",
    "segmentation_to_mask",
    "to_numpy",
    "to_tensor",
]
