// The `.idx` sidecar: a little-endian binary image of a MemberTable that numpy
// can view in place (every array starts 8-byte aligned), and DALI's
// webdataset index text format.
//
// Layout (version 1):
//   0   char[8] magic "FLIDX\0\0\1"
//   8   u32     version (1)
//   12  u32     header bytes (64)
//   16  u64     shard size in bytes
//   24  u64     num_members (M)
//   32  u64     num_samples (S)
//   40  u64     names bytes (N)
//   48  u64     total index bytes
//   56  u64     reserved (0)
//   64  u64[M]   member data offsets
//       u64[M]   member data sizes
//       u64[M+1] name offsets into the string table
//       u64[S]   first member of each sample
//       u32[S]   member count of each sample, zero-padded to 8 bytes
//       u8[N]    string table (member paths, concatenated), zero-padded to 8 bytes
#ifndef FASTLOAD_INDEX_FORMAT_H_
#define FASTLOAD_INDEX_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "tar_scan.h"

namespace fastload {

constexpr char kIndexMagic[8] = {'F', 'L', 'I', 'D', 'X', '\0', '\0', '\1'};
constexpr uint32_t kIndexVersion = 1;
constexpr uint64_t kIndexHeaderBytes = 64;

// Where each array of a validated index lives (byte offsets from its start).
struct IndexLayout {
  uint64_t shard_size = 0;
  uint64_t num_members = 0;
  uint64_t num_samples = 0;
  uint64_t names_bytes = 0;
  uint64_t offsets_at = 0;
  uint64_t sizes_at = 0;
  uint64_t name_offsets_at = 0;
  uint64_t sample_first_at = 0;
  uint64_t sample_count_at = 0;
  uint64_t names_at = 0;
  uint64_t total_bytes = 0;
};

// Serialises `table` into the sidecar format.
std::string SerializeIndex(const MemberTable& table);

// Checks that [data, data + len) is a well-formed index whose every offset,
// count and name is consistent, and fills `layout`. Never reads out of bounds.
Status ValidateIndex(const uint8_t* data, size_t len, IndexLayout* layout);

// Validates and copies an index back into a MemberTable.
Status ParseIndex(const uint8_t* data, size_t len, MemberTable* out);

// DALI's `wds2idx` text format ("v1.2 <samples>\n", then per sample one line of
// "<ext> <data offset> <size> <path>" groups). Names with whitespace cannot be
// expressed in it and are an error.
Status DaliIndexText(const MemberTable& table, std::string* out);

}  // namespace fastload

#endif  // FASTLOAD_INDEX_FORMAT_H_
