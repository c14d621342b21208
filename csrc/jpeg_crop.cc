#include "jpeg_crop.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <cstring>
#include <string>
#include <vector>

#include <jerror.h>
#include <jpeglib.h>

namespace fastload {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  int code = 0;  // libjpeg's message code of the error (or warning made fatal)
  char message[JMSG_LENGTH_MAX] = {0};
};

[[noreturn]] void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->code = cinfo->err->msg_code;
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// level -1 is a warning: libjpeg goes on with made-up data (gray blocks for a
// premature end), which would hand the caller a wrong image without a word.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0 || cinfo->err->msg_code == JWRN_EXTRANEOUS_DATA) return;
  OnError(cinfo);
}

void OnOutput(j_common_ptr) {}

// Owns the libjpeg state; destroyed (which frees libjpeg's pools) on every exit.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool created = false;
  Decompressor() {
    std::memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnError;
    err.pub.emit_message = OnMessage;
    err.pub.output_message = OnOutput;
  }
  ~Decompressor() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

JpegStatus Fail(JpegErrorKind kind, std::string message) {
  JpegStatus st;
  st.kind = kind;
  st.message = std::move(message);
  return st;
}

JpegStatus FromLibjpeg(const ErrorManager& err) {
  if (err.code == JWRN_JPEG_EOF || err.code == JERR_INPUT_EMPTY || err.code == JERR_INPUT_EOF) {
    return Fail(JpegErrorKind::kTruncated, std::string("truncated data (") + err.message + ")");
  }
  return Fail(JpegErrorKind::kCorrupt, std::string("corrupt data (libjpeg: ") + err.message + ")");
}

// Entropy-coded data cannot hold 0xFF 0xD9 (a 0xFF in it is followed by 0x00
// or a restart marker), so an end-of-image marker anywhere after the first
// scan's header means the data was not cut.
bool HasEndMarker(const uint8_t* data, size_t size, size_t from) {
  for (size_t i = size; i >= from + 2; --i) {
    if (data[i - 2] == 0xFF && data[i - 1] == 0xD9) return true;
  }
  return false;
}

// The part of a decode that may longjmp: nothing with a destructor lives in
// this frame, and what it fills lives in the caller's.
bool ReadHeader(Decompressor* d, const uint8_t* data, size_t size) {
  if (setjmp(d->err.jump)) return false;
  jpeg_create_decompress(&d->cinfo);
  d->created = true;
  jpeg_mem_src(&d->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d->cinfo, TRUE);
  return true;
}

void FillInfo(const jpeg_decompress_struct& cinfo, JpegInfo* info) {
  info->width = cinfo.image_width;
  info->height = cinfo.image_height;
  info->components = cinfo.num_components;
  info->color_space = static_cast<int>(cinfo.jpeg_color_space);
  info->progressive = cinfo.progressive_mode != 0;
}

struct Plan {
  JDIMENSION xoff = 0, xwidth = 0;  // the decoded columns (after libjpeg's alignment)
  JDIMENSION first_row = 0;         // the first row read (the rows above are skipped)
  int channels = 3;
};

bool Start(Decompressor* d, const JpegRegion& r, Plan* plan) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct& c = d->cinfo;
  jpeg_start_decompress(&c);
  plan->channels = c.output_components;
  // one iMCU of context on each side, in output pixels
  const JDIMENSION mx = static_cast<JDIMENSION>(c.max_h_samp_factor * c.min_DCT_scaled_size);
  const JDIMENSION my = static_cast<JDIMENSION>(c.max_v_samp_factor * c.min_DCT_scaled_size);
  JDIMENSION x0 = r.left > mx ? r.left - mx : 0;
  JDIMENSION x1 = std::min<JDIMENSION>(r.left + r.width + mx, c.output_width);
  plan->xoff = x0;
  plan->xwidth = x1 - x0;
  if (plan->xoff != 0 || plan->xwidth != c.output_width) {
    jpeg_crop_scanline(&c, &plan->xoff, &plan->xwidth);
  }
  plan->first_row = r.top > my ? r.top - my : 0;
  if (plan->first_row > 0) {
    JDIMENSION skipped = jpeg_skip_scanlines(&c, plan->first_row);
    if (skipped != plan->first_row) ERREXIT(&c, JERR_INPUT_EOF);
  }
  return true;
}

bool ReadRows(Decompressor* d, const JpegRegion& r, const Plan& plan, uint8_t* row,
              uint8_t* out) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct& c = d->cinfo;
  const size_t ch = static_cast<size_t>(plan.channels);
  const size_t skip_cols = static_cast<size_t>(r.left - plan.xoff) * ch;
  const size_t out_stride = static_cast<size_t>(r.width) * ch;
  JSAMPROW rows[1] = {row};
  const JDIMENSION end = r.top + r.height;
  while (c.output_scanline < end) {
    const JDIMENSION y = c.output_scanline;
    if (jpeg_read_scanlines(&c, rows, 1) != 1) ERREXIT(&c, JERR_INPUT_EOF);
    if (y >= r.top) std::memcpy(out + (y - r.top) * out_stride, row + skip_cols, out_stride);
  }
  return true;
}

}  // namespace

JpegStatus ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info) {
  if (size == 0) return Fail(JpegErrorKind::kTruncated, "empty data");
  Decompressor d;
  if (!ReadHeader(&d, data, size)) return FromLibjpeg(d.err);
  FillInfo(d.cinfo, info);
  return JpegStatus{};
}

JpegStatus DecodeJpegRegion(const uint8_t* data, size_t size, const JpegRegion& r,
                            std::vector<uint8_t>* pixels) {
  if (size == 0) return Fail(JpegErrorKind::kTruncated, "empty data");
  if (r.scale_denom != 1 && r.scale_denom != 2 && r.scale_denom != 4 && r.scale_denom != 8) {
    return Fail(JpegErrorKind::kBadRegion,
                "scale_denom must be 1, 2, 4 or 8, not " + std::to_string(r.scale_denom));
  }
  Decompressor d;
  if (!ReadHeader(&d, data, size)) return FromLibjpeg(d.err);
  jpeg_decompress_struct& c = d.cinfo;
  if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
    return Fail(JpegErrorKind::kUnsupported,
                std::string(c.jpeg_color_space == JCS_CMYK ? "CMYK" : "YCCK") +
                    " JPEG: decoded through Pillow's conversion");
  }
  const uint64_t pixels_in = static_cast<uint64_t>(c.image_width) * c.image_height;
  if (r.max_pixels != 0 && pixels_in > r.max_pixels) {
    return Fail(JpegErrorKind::kTooLarge,
                "too many pixels (" + std::to_string(c.image_width) + "x" +
                    std::to_string(c.image_height) + " = " + std::to_string(pixels_in) +
                    ", above the cap of " + std::to_string(r.max_pixels) + ")");
  }
  const size_t scan_at = static_cast<size_t>(c.src->next_input_byte - data);
  if (!HasEndMarker(data, size, scan_at)) {
    return Fail(JpegErrorKind::kTruncated,
                "truncated data (no end-of-image marker after the scan data at byte " +
                    std::to_string(scan_at) + ")");
  }
  c.out_color_space = r.gray ? JCS_GRAYSCALE : JCS_RGB;
  c.scale_num = 1;
  c.scale_denom = static_cast<unsigned int>(r.scale_denom);
  jpeg_calc_output_dimensions(&c);
  const uint64_t right = static_cast<uint64_t>(r.left) + r.width;
  const uint64_t bottom = static_cast<uint64_t>(r.top) + r.height;
  if (r.width == 0 || r.height == 0 || right > c.output_width || bottom > c.output_height) {
    return Fail(JpegErrorKind::kBadRegion,
                "region (left " + std::to_string(r.left) + ", top " + std::to_string(r.top) +
                    ", width " + std::to_string(r.width) + ", height " +
                    std::to_string(r.height) + ") is not inside the " +
                    std::to_string(c.output_width) + "x" + std::to_string(c.output_height) +
                    " image at scale 1/" + std::to_string(r.scale_denom));
  }
  Plan plan;
  if (!Start(&d, r, &plan)) return FromLibjpeg(d.err);
  std::vector<uint8_t> row(static_cast<size_t>(plan.xwidth) * plan.channels);
  pixels->assign(static_cast<size_t>(r.width) * r.height * plan.channels, 0);
  if (!ReadRows(&d, r, plan, row.data(), pixels->data())) return FromLibjpeg(d.err);
  return JpegStatus{};
}

}  // namespace fastload
