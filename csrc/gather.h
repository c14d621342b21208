// Gathering byte ranges of several sources into one destination buffer: how the
// batch transport packs a batch's samples out of the cache's mappings. Pure C++,
// no Python headers (the binding releases the GIL around it; the fuzz harness
// drives it directly).
#ifndef FASTLOAD_GATHER_H_
#define FASTLOAD_GATHER_H_

#include <cstddef>
#include <cstdint>

namespace fastload {

struct GatherSource {
  const uint8_t* data;
  uint64_t size;
};

// One row of a gather: copy `size` bytes from `sources[source] + src_offset` to
// `dst + dst_offset`.
struct GatherPiece {
  int64_t source;
  int64_t src_offset;
  int64_t size;
  int64_t dst_offset;
};

// The first piece that does not lie inside its source and the destination (a
// negative field, a source index out of range, a range past either end, also
// where the sums overflow), or -1 when every piece is in bounds.
int64_t FirstBadPiece(const GatherSource* sources, size_t num_sources,
                      const GatherPiece* pieces, size_t num_pieces, uint64_t dst_size);

// Copies every piece, in order, after checking them all with FirstBadPiece: returns
// its answer, and copies nothing unless it is -1. Overlapping destination ranges
// are written in order (the last one wins); no byte outside [dst, dst + dst_size)
// or outside a source is ever read or written.
int64_t Gather(const GatherSource* sources, size_t num_sources, const GatherPiece* pieces,
               size_t num_pieces, uint8_t* dst, uint64_t dst_size);

}  // namespace fastload

#endif  // FASTLOAD_GATHER_H_
