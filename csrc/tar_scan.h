// Tar scanner: turns a tar archive held in memory into a member table grouped
// into WebDataset samples. Pure C++17, no Python: the binding and the fuzz
// harness both link this.
//
// Rules (the Python reference scanner in tests/index/reference.py mirrors them;
// fuzz/diff_tarfile.py checks them against Python's tarfile and webdataset):
//  * Formats: v7, old GNU, POSIX ustar (prefix + name; like tarfile, a
//    non-empty prefix field is used whatever the magic), PAX 'x' headers
//    (`path` and `size` honoured, other keys ignored; a `path` loses trailing
//    slashes, as in tarfile), PAX 'g' global headers (skipped, but one that
//    sets `path` or `size` is refused: tarfile would apply them to every
//    member), GNU 'L' long names and 'K' long link names. Sizes in octal or
//    GNU base-256.
//  * Several extended headers before one member: as in tarfile, the first one
//    that sets the name (a PAX `path` or a GNU long name) wins, and so does the
//    first PAX `size`; inside one PAX header the last record of a key wins.
//  * The archive ends at the first all-zero header block (like tarfile). An
//    archive without one (cut on a block boundary, or empty) is refused as
//    truncated, with the offset where the end-of-archive block should be; so
//    is a partial header block, or member data (with its padding) cut by EOF.
//  * Header checksums are verified (unsigned or signed sum, as tarfile does),
//    and the numeric fields fastload does not use (mode, uid, gid, mtime,
//    devmajor, devminor) must parse, as tarfile requires.
//  * Regular files ('0', '\0', '7') are candidates; directories ('5', or a v7
//    regular entry whose name ends in '/') and 'V' volume labels are skipped.
//    Hard links, symlinks, devices, FIFOs, sparse and unknown types are
//    refused, as are absolute paths, paths with a ".." component and names
//    with a NUL inside (also in the name field, prefix or GNU long name: bytes
//    after a terminating NUL must be NULs).
//  * WebDataset grouping: key = path up to the first '.' of the basename,
//    field = the rest. Like webdataset, members whose basename has no dot are
//    skipped, and so are top-level "__*__" metadata files and everything in a
//    top-level "__*__/" directory; unlike webdataset (and like DALI's wds2idx)
//    basenames starting with '.' (hidden files) and names ending in '.' (empty
//    field) are skipped too. Adjacent members with the same key form one
//    sample; a field repeated inside a sample, a field starting with "__"
//    (it would collide with __key__ and the like), more than kMaxFields
//    fields in one sample, or a key reappearing after other samples is an
//    error. Fields keep their case.
//  * Skipped members do not appear in the table and do not break adjacency.
//  * Linear time on any input: keys and fields are found in hash sets keyed
//    with a random SipHash key per scan, so crafted names cannot collide.
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
  kReservedField = 13,  // a field name starting with "__"
  kTooManyFields = 14,  // more than kMaxFields fields in one sample
};

// Most fields one sample may have.
constexpr uint32_t kMaxFields = 4096;

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

// Where the archive's bytes come from: memory, or a file read with pread (in
// the binding), so that a file shrinking under the scan is an error, not SIGBUS.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Bytes [off, off + n) (the caller ensures off + n <= size()), valid until the
  // next call; nullptr with *st set if they cannot be read.
  virtual const uint8_t* Read(uint64_t off, size_t n, Status* st) = 0;
  // A hint that the 512 bytes at `off` (< size()) will be read soon; no effect by default.
  virtual void WillRead(uint64_t off) { (void)off; }
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(const uint8_t* data, size_t len) : data_(data), len_(len) {}
  uint64_t size() const override { return len_; }
  const uint8_t* Read(uint64_t off, size_t, Status*) override { return data_ + off; }
  void WillRead(uint64_t off) override {
#if defined(__GNUC__)
    for (size_t i = 0; i < 512; i += 64) __builtin_prefetch(data_ + off + i);
#else
    (void)off;
#endif
  }

 private:
  const uint8_t* data_;
  size_t len_;
};

// One regular-file member, its name resolved from its (extended) headers.
struct Member {
  std::string name;
  uint64_t header_offset = 0;  // its first header (extended or not), for errors
  uint64_t data_offset = 0;
  uint64_t size = 0;
};

// The tar layer: walks the headers and yields the regular-file members.
class HeaderParser {
 public:
  explicit HeaderParser(ByteSource* src) : src_(src) {}
  // Fills `m` with the next regular-file member and returns true; returns false
  // at the end-of-archive block (st ok) or on an error (st set).
  bool Next(Member* m, Status* st);

 private:
  ByteSource* src_;
  uint64_t pos_ = 0;
};

// The WebDataset layer: groups members into samples in `out`.
class SampleGrouper {
 public:
  explicit SampleGrouper(MemberTable* out);
  ~SampleGrouper();
  SampleGrouper(const SampleGrouper&) = delete;
  SampleGrouper& operator=(const SampleGrouper&) = delete;
  // Adds `m` to the table (or skips it, see KeyLength); an error on a
  // duplicate key or field, a reserved field or too many fields.
  Status Add(const Member& m);

 private:
  struct Impl;
  Impl* impl_;
};

// Scans `len` bytes at `data` into `out` (cleared first). Never reads outside
// [data, data + len). On error `out` is left cleared.
Status ScanTar(const uint8_t* data, size_t len, MemberTable* out);

// Same, reading through `src`.
Status ScanSource(ByteSource* src, MemberTable* out);

}  // namespace fastload

#endif  // FASTLOAD_TAR_SCAN_H_
