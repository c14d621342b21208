// libFuzzer harness over the C++ core: scan a tar, serialise its index, parse
// it back, render the DALI text; and treat the same bytes as an index. Every
// invariant the Python layer relies on is checked; a violation aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fastload::MemberTable table;
  fastload::Status st = fastload::ScanTar(data, size, &table);
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
