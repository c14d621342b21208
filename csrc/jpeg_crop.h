// Region and scale decode of a JPEG held in memory, against libjpeg-turbo's
// partial-decode API (jpeg_crop_scanline, jpeg_skip_scanlines) and its DCT
// scaling (1/1, 1/2, 1/4, 1/8). Pure C++17, no Python: the binding and the fuzz
// harness both link this.
//
// Rules:
//  * Every libjpeg error ends in a JpegStatus (setjmp/longjmp error manager),
//    never in exit() or abort(); so do libjpeg's warnings about corrupt data
//    (a bad Huffman code, a premature end of data), except extraneous bytes
//    before a marker, which decoders (Pillow's too) accept.
//  * A JPEG without an end-of-image marker after its first scan is truncated,
//    even where the rows asked for lie above the cut (a baseline decode of the
//    top rows never reads the rest): the caller gets an error, never a region
//    of a file that is incomplete.
//  * The region is given in the scaled image's pixels and must lie inside it.
//    libjpeg aligns a crop's left edge down to an iMCU column and an upsampled
//    row needs its neighbours, so the decoder reads up to one iMCU more on
//    every side (where the image has it) and copies out exactly the region:
//    the pixels equal a full decode at the same scale except where chroma
//    upsampling reaches the extended edge (tests/decode/test_crop.py measures it).
//  * Output is RGB (3 channels) or grayscale (1). Grayscale and YCbCr/RGB
//    JPEGs give either; CMYK/YCCK JPEGs are refused as unsupported, for the
//    caller to decode another way (Pillow's conversion).
//  * EXIF orientation is not applied (fastload's Pillow decode path does not
//    apply it either).
#ifndef FASTLOAD_JPEG_CROP_H_
#define FASTLOAD_JPEG_CROP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

enum class JpegErrorKind : int {
  kOk = 0,
  kCorrupt = 1,      // libjpeg refused the data (bad marker, Huffman code, ...)
  kTruncated = 2,    // the data ends before the end-of-image marker
  kUnsupported = 3,  // valid but not decoded here (CMYK/YCCK)
  kTooLarge = 4,     // more pixels than the caller's cap
  kBadRegion = 5,    // the region is not inside the (scaled) image
};

struct JpegStatus {
  JpegErrorKind kind = JpegErrorKind::kOk;
  std::string message;
  bool ok() const { return kind == JpegErrorKind::kOk; }
};

// What the header says.
struct JpegInfo {
  uint32_t width = 0;
  uint32_t height = 0;
  int components = 0;
  // libjpeg's J_COLOR_SPACE of the stored data (1 gray, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK).
  int color_space = 0;
  bool progressive = false;
};

struct JpegRegion {
  // In the pixels of the image scaled by 1/scale_denom (libjpeg rounds the
  // scaled size up: ceil(width / scale_denom)).
  uint32_t left = 0;
  uint32_t top = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  int scale_denom = 1;  // 1, 2, 4 or 8
  bool gray = false;    // one channel (the luma plane) instead of RGB
  uint64_t max_pixels = 0;  // refuse images with more (0: no cap)
};

// Reads the header only.
JpegStatus ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info);

// Decodes `region` into `pixels` (HWC uint8, width * height * channels bytes,
// channels 3 or 1 as asked).
JpegStatus DecodeJpegRegion(const uint8_t* data, size_t size, const JpegRegion& region,
                            std::vector<uint8_t>* pixels);

}  // namespace fastload

#endif  // FASTLOAD_JPEG_CROP_H_
