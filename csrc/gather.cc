#include "gather.h"

#include <cstring>

namespace fastload {

namespace {

// [offset, offset + size) inside [0, limit), without overflow.
bool InBounds(int64_t offset, int64_t size, uint64_t limit) {
  if (offset < 0 || size < 0) return false;
  const uint64_t off = static_cast<uint64_t>(offset);
  const uint64_t len = static_cast<uint64_t>(size);
  return off <= limit && len <= limit - off;
}

}  // namespace

int64_t FirstBadPiece(const GatherSource* sources, size_t num_sources,
                      const GatherPiece* pieces, size_t num_pieces, uint64_t dst_size) {
  for (size_t i = 0; i < num_pieces; ++i) {
    const GatherPiece& p = pieces[i];
    if (p.source < 0 || static_cast<uint64_t>(p.source) >= num_sources) {
      return static_cast<int64_t>(i);
    }
    const GatherSource& s = sources[p.source];
    if (!InBounds(p.src_offset, p.size, s.size) || !InBounds(p.dst_offset, p.size, dst_size)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

int64_t Gather(const GatherSource* sources, size_t num_sources, const GatherPiece* pieces,
               size_t num_pieces, uint8_t* dst, uint64_t dst_size) {
  const int64_t bad = FirstBadPiece(sources, num_sources, pieces, num_pieces, dst_size);
  if (bad >= 0) return bad;
  for (size_t i = 0; i < num_pieces; ++i) {
    const GatherPiece& p = pieces[i];
    if (p.size == 0) continue;  // also where a source or dst pointer may be null
    std::memmove(dst + p.dst_offset, sources[p.source].data + p.src_offset,
                 static_cast<size_t>(p.size));
  }
  return -1;
}

}  // namespace fastload
