// libFuzzer harness over the JPEG region decoder (csrc/jpeg_crop.cc): the header
// reader, then regions of the image at every DCT scale (the whole image, a corner
// and a middle band, picked from the header's size), each either a clean error or
// exactly width x height x channels bytes. libjpeg itself is the system's (not
// instrumented); the harness checks the code around it: the setjmp error manager,
// the crop and skip arithmetic, the copies out of the row buffer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "jpeg_crop.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

void Region(const uint8_t* data, size_t size, uint32_t left, uint32_t top, uint32_t w,
            uint32_t h, int denom, bool gray) {
  fastload::JpegRegion r;
  r.left = left;
  r.top = top;
  r.width = w;
  r.height = h;
  r.scale_denom = denom;
  r.gray = gray;
  r.max_pixels = 1u << 22;  // keep each input fast
  std::vector<uint8_t> pixels;
  fastload::JpegStatus st = fastload::DecodeJpegRegion(data, size, r, &pixels);
  if (st.ok()) {
    Check(pixels.size() == static_cast<size_t>(w) * h * (gray ? 1 : 3), "pixels fill the region");
  } else {
    Check(!st.message.empty(), "an error says what is wrong");
    Check(st.kind != fastload::JpegErrorKind::kOk, "an error has a kind");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fastload::JpegInfo info;
  fastload::JpegStatus st = fastload::ReadJpegInfo(data, size, &info);
  if (!st.ok()) {
    Region(data, size, 0, 0, 1, 1, 1, false);  // must fail the same clean way
    return 0;
  }
  if (static_cast<uint64_t>(info.width) * info.height > (1u << 22)) return 0;
  for (int denom : {1, 2, 4, 8}) {
    const uint32_t w = (info.width + denom - 1) / denom;
    const uint32_t h = (info.height + denom - 1) / denom;
    if (w == 0 || h == 0) continue;
    const bool gray = denom == 2;
    Region(data, size, 0, 0, w, h, denom, gray);
    Region(data, size, w / 3, h / 2, w - w / 3, h - h / 2, denom, gray);
    Region(data, size, w - 1, h - 1, 1, 1, denom, !gray);
    Region(data, size, 0, 0, w + 1, 1, denom, gray);  // outside: refused
  }
  return 0;
}
