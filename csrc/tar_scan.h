// Tar scanner: turns a tar archive held in memory into a member table grouped
// into WebDataset samples. Pure C++17, no Python: the binding and the fuzz
// harness both link this.
//
// Rules (the Python reference scanner in tests/index/reference.py mirrors them):
//  * Formats: v7, old GNU, POSIX ustar (prefix + name), PAX 'x' headers
//    (`path` and `size` honoured, other keys ignored), PAX 'g' global headers
//    (skipped: a global path/size makes no sense for a shard), GNU 'L' long
//    names and 'K' long link names. Sizes in octal or GNU base-256.
//  * The archive ends at the first all-zero header block (like Python's
//    tarfile) or at EOF on a block boundary between members. A partial header
//    block, or member data (with its padding) cut by EOF, is an error.
//  * Header checksums are verified (unsigned or signed sum, as tarfile does).
//  * Regular files ('0', '\0', '7') are candidates; directories ('5', or a v7
//    regular entry whose name ends in '/') and 'V' volume labels are skipped.
//    Hard links, symlinks, devices, FIFOs, sparse and unknown types are
//    refused, as are absolute paths, paths with a ".." component and names
//    containing NUL.
//  * WebDataset grouping: key = path up to the first '.' of the basename,
//    field = the rest. Like webdataset, members whose basename has no dot are
//    skipped, and so are top-level "__*__" metadata files; unlike webdataset
//    (and like DALI's wds2idx) basenames starting with '.' (hidden files) and
//    names ending in '.' (empty field) are skipped too. Adjacent members with
//    the same key form one sample; a field repeated inside a sample or a key
//    reappearing after other samples is an error. Fields keep their case.
//  * Skipped members do not appear in the table and do not break adjacency.
#ifndef FASTLOAD_TAR_SCAN_H_
#define FASTLOAD_TAR_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

enum class ErrorCode : int {
  kOk = 0,
  kTruncated = 1,       // EOF inside a header or inside member data
  kBadChecksum = 2,     // header checksum mismatch
  kBadHeader = 3,       // unparsable numeric field, bad magic field, ...
  kBadPax = 4,          // malformed PAX extended header record
  kRefusedMember = 5,   // link, device, FIFO, sparse or unknown member type
  kUnsafePath = 6,      // absolute path, ".." component, NUL in the name
  kDuplicateKey = 7,    // a key reappears non-adjacently
  kDuplicateField = 8,  // the same field twice in one sample
  kTooLarge = 9,        // a size that cannot be represented
  kBadIndex = 10,       // a corrupt index sidecar
  kIo = 11,             // open/mmap failure (binding only)
  kUnsupported = 12,    // valid, but not expressible in the requested output format
};

// Error with the byte offset (of the header or record concerned) it was found at.
struct Status {
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  uint64_t offset = 0;

  bool ok() const { return code == ErrorCode::kOk; }
  static Status Ok() { return Status{}; }
  static Status Error(ErrorCode c, std::string msg, uint64_t off) {
    Status s;
    s.code = c;
    s.message = std::move(msg);
    s.offset = off;
    return s;
  }
};

// Member table of a shard, in archive order, already grouped into samples.
// Members of sample s are [sample_first[s], sample_first[s] + sample_count[s]).
struct MemberTable {
  uint64_t shard_size = 0;            // length of the scanned buffer
  std::vector<uint64_t> offsets;      // data offset of each member
  std::vector<uint64_t> sizes;        // data size of each member
  std::vector<uint64_t> name_offsets; // num_members + 1 offsets into `names`
  std::string names;                  // concatenated member paths (no separators)
  std::vector<uint64_t> sample_first; // first member of each sample
  std::vector<uint32_t> sample_count; // number of members of each sample

  size_t num_members() const { return offsets.size(); }
  size_t num_samples() const { return sample_first.size(); }
  void clear();
};

// Position of the first '.' of the basename of `name`, or npos-like SIZE_MAX
// when the member is not part of a sample (see the rules above).
size_t KeyLength(const char* name, size_t len);

// Scans `len` bytes at `data` into `out` (cleared first). Never reads outside
// [data, data + len). On error `out` is left cleared.
Status ScanTar(const uint8_t* data, size_t len, MemberTable* out);

}  // namespace fastload

#endif  // FASTLOAD_TAR_SCAN_H_
