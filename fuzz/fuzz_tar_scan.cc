// libFuzzer harness over the C++ core: scan a tar, serialise its index, parse
// it back, render the DALI text; the header parser alone, through a source that
// hands out a fresh copy per read (as the binding's pread windows do, so a
// stale pointer is a use-after-free ASan sees); the sample grouper alone on the
// input read as newline-separated member names; and the same bytes as an index.
// Every invariant the Python layer relies on is checked; a violation aborts.
// (fuzz/diff_tarfile.py compares the scanner with tarfile and webdataset.)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <cstring>

#include "gather.h"
#include "index_format.h"
#include "tar_scan.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

bool SameTable(const fastload::MemberTable& a, const fastload::MemberTable& b) {
  return a.shard_size == b.shard_size && a.offsets == b.offsets && a.sizes == b.sizes &&
         a.name_offsets == b.name_offsets && a.names == b.names &&
         a.sample_first == b.sample_first && a.sample_count == b.sample_count;
}

void CheckTable(const fastload::MemberTable& t, size_t len) {
  Check(t.shard_size == len, "shard_size is the buffer length");
  Check(t.sizes.size() == t.num_members(), "sizes per member");
  Check(t.name_offsets.size() == t.num_members() + 1, "name offsets per member + 1");
  Check(t.sample_count.size() == t.num_samples(), "count per sample");
  uint64_t prev_end = 0;
  for (size_t i = 0; i < t.num_members(); ++i) {
    Check(t.offsets[i] % 512 == 0, "data offsets are block aligned");
    Check(t.offsets[i] >= prev_end + 512, "members are in order, after their header");
    Check(t.offsets[i] <= len && t.sizes[i] <= len - t.offsets[i], "member data in bounds");
    prev_end = t.offsets[i] + t.sizes[i];
    Check(t.name_offsets[i] < t.name_offsets[i + 1], "names are non-empty");
  }
  Check(t.name_offsets.back() == t.names.size(), "names cover the string table");
  uint64_t next = 0;
  for (size_t s = 0; s < t.num_samples(); ++s) {
    Check(t.sample_first[s] == next && t.sample_count[s] > 0, "samples tile the members");
    next += t.sample_count[s];
  }
  Check(next == t.num_members(), "samples cover all members");
}

// Each Read returns a newly allocated copy and frees the previous one.
class CopyingSource final : public fastload::ByteSource {
 public:
  CopyingSource(const uint8_t* data, size_t len) : data_(data), len_(len) {}
  uint64_t size() const override { return len_; }
  const uint8_t* Read(uint64_t off, size_t n, fastload::Status*) override {
    buf_.reset(new uint8_t[n ? n : 1]);
    if (n) std::memcpy(buf_.get(), data_ + off, n);
    return buf_.get();
  }

 private:
  const uint8_t* data_;
  size_t len_;
  std::unique_ptr<uint8_t[]> buf_;
};

void FuzzHeaderParser(const uint8_t* data, size_t size) {
  CopyingSource src(data, size);
  fastload::HeaderParser parser(&src);
  fastload::Member m;
  fastload::Status st;
  uint64_t prev_end = 0;
  while (parser.Next(&m, &st)) {
    Check(m.header_offset < m.data_offset && m.data_offset % 512 == 0, "member after header");
    Check(m.data_offset >= prev_end + 512, "members in order");
    Check(m.data_offset <= size && m.size <= size - m.data_offset, "member data in bounds");
    Check(!m.name.empty() && m.name.find('\0') == std::string::npos, "names are clean");
    prev_end = m.data_offset + m.size;
  }
  Check(st.ok() || st.offset <= size, "parser error offset in bounds");
}

// The input as member names, one per line: groups like webdataset or refuses.
void FuzzSampleGrouper(const uint8_t* data, size_t size) {
  fastload::MemberTable table;
  table.name_offsets.push_back(0);
  fastload::SampleGrouper grouper(&table);
  std::string_view text(reinterpret_cast<const char*>(data), size);
  fastload::Member m;
  uint64_t off = 512;
  bool failed = false;
  while (!text.empty() && !failed) {
    size_t nl = text.find('\n');
    m.name.assign(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    m.header_offset = off - 512;
    m.data_offset = off;
    m.size = 0;
    off += 1024;
    failed = !grouper.Add(m).ok();
  }
  if (failed) return;
  std::set<std::string> keys;
  for (size_t s = 0; s < table.num_samples(); ++s) {
    std::set<std::string> fields;
    std::string key;
    for (uint64_t i = table.sample_first[s]; i < table.sample_first[s] + table.sample_count[s];
         ++i) {
      std::string name = table.names.substr(table.name_offsets[i],
                                            table.name_offsets[i + 1] - table.name_offsets[i]);
      size_t kl = fastload::KeyLength(name.data(), name.size());
      Check(kl != SIZE_MAX, "grouped members are sample members");
      if (key.empty()) key = name.substr(0, kl);
      Check(name.substr(0, kl) == key, "one key per sample");
      Check(fields.insert(name.substr(kl + 1)).second, "no repeated field");
      Check(name.compare(kl + 1, 2, "__") != 0, "no reserved field");
    }
    Check(fields.size() <= fastload::kMaxFields, "field cap");
    Check(keys.insert(key).second, "no repeated key");
  }
}

}  // namespace

// The batch gather on rows read from the input (int64 fields, often huge or
// negative): three heap copies of slices of the input as sources, a destination of
// a size from the input. A row in bounds is copied exactly; any other makes
// Gather copy nothing and name the first such row. ASan sees any access outside.
void FuzzGather(const uint8_t* data, size_t size) {
  if (size < 4) return;
  std::vector<std::vector<uint8_t>> owned;
  for (size_t k = 0; k < 3; ++k) {
    size_t n = data[k] % 64;
    n = n < size ? n : size;
    owned.emplace_back(data, data + n);  // its own allocation: no slack after it
  }
  std::vector<fastload::GatherSource> srcs;
  for (const auto& o : owned) srcs.push_back({o.data(), o.size()});
  const size_t dst_size = data[3] % 128;
  std::vector<fastload::GatherPiece> rows((size - 4) / sizeof(fastload::GatherPiece));
  if (!rows.empty()) std::memcpy(rows.data(), data + 4, rows.size() * sizeof(rows[0]));
  for (auto& r : rows) {  // mostly small values, so that some rows are in bounds
    if ((r.source & 0xF0) != 0xF0) r.source &= 3;
    if ((r.size & 0xF0) != 0xF0) r.size &= 63;
    if ((r.src_offset & 0xF0) != 0xF0) r.src_offset &= 63;
    if ((r.dst_offset & 0xF0) != 0xF0) r.dst_offset &= 127;
  }
  std::vector<uint8_t> dst(dst_size, 0xAB);
  const int64_t bad = fastload::Gather(srcs.data(), srcs.size(), rows.data(), rows.size(),
                                       dst.data(), dst.size());
  const int64_t first = fastload::FirstBadPiece(srcs.data(), srcs.size(), rows.data(),
                                                rows.size(), dst.size());
  Check(bad == first, "Gather answers what FirstBadPiece finds");
  std::vector<uint8_t> want(dst_size, 0xAB);
  if (bad < 0) {
    for (const auto& r : rows) {
      if (r.size > 0) {
        std::memmove(want.data() + r.dst_offset, srcs[r.source].data + r.src_offset,
                     static_cast<size_t>(r.size));
      }
    }
  } else {
    Check(static_cast<size_t>(bad) < rows.size(), "the bad row is a row");
  }
  Check(dst == want, "in-bounds rows copied in order; nothing copied otherwise");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzHeaderParser(data, size);
  FuzzGather(data, size);
  FuzzSampleGrouper(data, size);
  fastload::MemberTable table;
  fastload::Status st = fastload::ScanTar(data, size, &table);
  {
    CopyingSource copying(data, size);
    fastload::MemberTable again;
    fastload::Status st2 = fastload::ScanSource(&copying, &again);
    Check(st.ok() == st2.ok() && st.code == st2.code && st.offset == st2.offset,
          "memory and windowed sources agree");
    if (st.ok()) Check(SameTable(table, again), "memory and windowed tables agree");
  }
  if (st.ok()) {
    CheckTable(table, size);
    std::string idx = fastload::SerializeIndex(table);
    fastload::IndexLayout layout;
    fastload::Status v = fastload::ValidateIndex(reinterpret_cast<const uint8_t*>(idx.data()),
                                                 idx.size(), &layout);
    if (!v.ok()) {
      std::fprintf(stderr, "own index rejected: %s at %llu\n", v.message.c_str(),
                   static_cast<unsigned long long>(v.offset));
      std::abort();
    }
    Check(layout.total_bytes == idx.size() && layout.total_bytes % 8 == 0, "index is 8-aligned");
    fastload::MemberTable back;
    Check(fastload::ParseIndex(reinterpret_cast<const uint8_t*>(idx.data()), idx.size(), &back)
              .ok(),
          "parse own index");
    Check(SameTable(table, back), "index round trip");
    // Every truncation of a valid index is rejected.
    size_t cut = size % (idx.size() ? idx.size() : 1);
    Check(!fastload::ValidateIndex(reinterpret_cast<const uint8_t*>(idx.data()), cut, &layout)
               .ok(),
          "truncated index rejected");
    std::string text;
    fastload::DaliIndexText(table, &text);
  } else {
    Check(table.num_members() == 0 && table.num_samples() == 0, "error leaves table empty");
    Check(st.offset <= size, "error offset in bounds");
  }
  // The same bytes as an index sidecar: must validate cleanly or be refused.
  fastload::MemberTable parsed;
  if (fastload::ParseIndex(data, size, &parsed).ok()) {
    Check(parsed.num_members() <= size / 24, "parsed counts bounded by the input");
    std::string again = fastload::SerializeIndex(parsed);
    Check(again.size() == size, "re-serialised index has the same size");
    std::string text;
    fastload::DaliIndexText(parsed, &text);
  }
  return 0;
}
