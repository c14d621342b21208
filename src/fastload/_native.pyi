"""fastload's C++ core: tar scanning, the shard index format and the batch gather."""

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

class FormatError(ValueError):
    pass

INDEX_VERSION: int = 1

INDEX_MAGIC: bytes = ...

def scan(buffer: object) -> dict:
    """
    Scan a tar held in a contiguous buffer (bytes, memoryview, mmap, numpy uint8)
    into its member table: a dict of numpy arrays 'offsets', 'sizes', 'name_offsets',
    'sample_first', 'sample_count', the 'names' blob and 'shard_size'.
    Raises FormatError(message, offset, code) for a malformed or refused archive.
    """

def scan_file(path: bytes) -> dict:
    """
    Like scan(), for a file path (bytes, os.fsencode'd), read in pread windows (a file
    that shrinks meanwhile is a FormatError with code 11, never SIGBUS).
    Raises OSError if it cannot be opened and FormatError if it is malformed.
    """

def build_index(buffer: object) -> bytes:
    """
    Scan a tar buffer and return its serialised .idx sidecar as bytes.
    Raises FormatError for a malformed or refused archive.
    """

def build_index_file(path: bytes) -> bytes:
    """
    Scan a tar file (pread windows) and return its serialised .idx sidecar as bytes.
    Raises OSError or FormatError.
    """

def validate_index(buffer: object) -> dict:
    """
    Validate a serialised index in place and return where its arrays lie (byte
    offsets) with its counts. Raises FormatError if it is corrupt or truncated.
    """

def gather(dst: object, sources: Sequence[object], pieces: object) -> int:
    """
    Copy byte ranges of several buffers into the writable buffer dst, with the GIL
    released for the whole copy. pieces: a C-contiguous int64 array of rows
    (source index, source offset, size, dst offset). Every row is checked first:
    returns -1 when all were in bounds and copied, else the first row that is not
    (nothing is copied then).
    """

def dali_index(index: object) -> bytes:
    """
    Render a serialised index as DALI's webdataset index text (wds2idx 'v1.2').
    Raises FormatError if the index is corrupt or a name holds whitespace.
    """

# Present when the extension was built with libjpeg-turbo (HAVE_JPEG); see
# csrc/jpeg_crop.h and fastload.decode.crop.
HAVE_JPEG: bool

class JpegError(ValueError):
    pass

def jpeg_info(buffer: object) -> tuple[int, int, int, int, bool]:
    """
    Read a JPEG's header: (width, height, components, libjpeg color space, progressive).
    Raises JpegError(message, kind) if the header is corrupt or truncated.
    """

def decode_jpeg_region(
    buffer: object,
    left: int,
    top: int,
    width: int,
    height: int,
    scale_denom: int,
    gray: bool,
    max_pixels: int,
) -> NDArray[np.uint8]:
    """
    Decode a region of a JPEG (in the pixels of the image scaled by 1/scale_denom,
    1, 2, 4 or 8) to an HWC uint8 array of 3 (RGB) or 1 (gray) channels, with the GIL
    released. Raises JpegError(message, kind): kind 1 corrupt, 2 truncated,
    3 unsupported (CMYK/YCCK), 4 too many pixels, 5 region outside the image.
    """
