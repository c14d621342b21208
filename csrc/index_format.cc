#include "index_format.h"

#include <cstring>
#include <string_view>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the index format is little-endian; add byte swapping for this platform"
#endif

namespace fastload {
namespace {

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
void AppendArray(std::string* out, const T* p, size_t n) {
  if (n) out->append(reinterpret_cast<const char*>(p), n * sizeof(T));
}

void PadTo8(std::string* out) { out->resize(Align8(out->size()), '\0'); }

// Section offsets for the given counts. Counts must already be bounded so
// nothing overflows (ValidateIndex bounds them by the buffer length first).
IndexLayout ComputeLayout(uint64_t shard_size, uint64_t m, uint64_t s, uint64_t n) {
  IndexLayout l;
  l.shard_size = shard_size;
  l.num_members = m;
  l.num_samples = s;
  l.names_bytes = n;
  l.offsets_at = kIndexHeaderBytes;
  l.sizes_at = l.offsets_at + 8 * m;
  l.name_offsets_at = l.sizes_at + 8 * m;
  l.sample_first_at = l.name_offsets_at + 8 * (m + 1);
  l.sample_count_at = l.sample_first_at + 8 * s;
  l.names_at = l.sample_count_at + Align8(4 * s);
  l.total_bytes = l.names_at + Align8(n);
  return l;
}

Status Bad(std::string msg, uint64_t off) {
  return Status::Error(ErrorCode::kBadIndex, std::move(msg), off);
}

}  // namespace

std::string SerializeIndex(const MemberTable& t) {
  const uint64_t m = t.num_members();
  const uint64_t s = t.num_samples();
  const uint64_t n = t.names.size();
  IndexLayout l = ComputeLayout(t.shard_size, m, s, n);
  std::string out;
  out.reserve(static_cast<size_t>(l.total_bytes));
  out.append(kIndexMagic, sizeof(kIndexMagic));
  Append<uint32_t>(&out, kIndexVersion);
  Append<uint32_t>(&out, static_cast<uint32_t>(kIndexHeaderBytes));
  Append<uint64_t>(&out, t.shard_size);
  Append<uint64_t>(&out, m);
  Append<uint64_t>(&out, s);
  Append<uint64_t>(&out, n);
  Append<uint64_t>(&out, l.total_bytes);
  Append<uint64_t>(&out, 0);
  AppendArray(&out, t.offsets.data(), m);
  AppendArray(&out, t.sizes.data(), m);
  if (t.name_offsets.size() == m + 1) {
    AppendArray(&out, t.name_offsets.data(), m + 1);
  } else {  // a default-constructed empty table has no leading 0 yet
    Append<uint64_t>(&out, 0);
  }
  AppendArray(&out, t.sample_first.data(), s);
  AppendArray(&out, t.sample_count.data(), s);
  PadTo8(&out);
  out += t.names;
  PadTo8(&out);
  return out;
}

Status ValidateIndex(const uint8_t* data, size_t len, IndexLayout* layout) {
  if (len < kIndexHeaderBytes) {
    return Bad("index is " + std::to_string(len) + " bytes, shorter than its 64-byte header",
               0);
  }
  if (std::memcmp(data, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Bad("bad magic: not a fastload index", 0);
  }
  uint32_t version = Load<uint32_t>(data + 8);
  if (version != kIndexVersion) {
    return Bad("unsupported index version " + std::to_string(version) + " (this build reads " +
                   std::to_string(kIndexVersion) + ")",
               8);
  }
  if (Load<uint32_t>(data + 12) != kIndexHeaderBytes) return Bad("bad header size", 12);
  const uint64_t shard_size = Load<uint64_t>(data + 16);
  const uint64_t m = Load<uint64_t>(data + 24);
  const uint64_t s = Load<uint64_t>(data + 32);
  const uint64_t n = Load<uint64_t>(data + 40);
  const uint64_t total = Load<uint64_t>(data + 48);
  if (Load<uint64_t>(data + 56) != 0) return Bad("reserved header field is not zero", 56);
  if (total != len) {
    return Bad("header says the index is " + std::to_string(total) + " bytes but it is " +
                   std::to_string(len),
               48);
  }
  // Bound the counts by the buffer before any arithmetic on them.
  if (m > len / 24 || s > len / 12 || n > len) {
    return Bad("member/sample/name counts do not fit the index size", 24);
  }
  IndexLayout l = ComputeLayout(shard_size, m, s, n);
  if (l.total_bytes != len) {
    return Bad("index size " + std::to_string(len) + " does not match its counts (expected " +
                   std::to_string(l.total_bytes) + ")",
               24);
  }
  if ((m == 0) != (s == 0)) return Bad("members without samples or samples without members", 24);

  uint64_t prev_end = 0;
  for (uint64_t i = 0; i < m; ++i) {
    uint64_t off = Load<uint64_t>(data + l.offsets_at + 8 * i);
    uint64_t size = Load<uint64_t>(data + l.sizes_at + 8 * i);
    if (off % 512 != 0 || off < 512 || off - 512 < prev_end || off > shard_size ||
        size > shard_size - off) {
      return Bad("member " + std::to_string(i) + " has a bad offset/size (" +
                     std::to_string(off) + ", " + std::to_string(size) + ") for a " +
                     std::to_string(shard_size) + "-byte shard",
                 l.offsets_at + 8 * i);
    }
    prev_end = off + size;
  }
  if (Load<uint64_t>(data + l.name_offsets_at) != 0) {
    return Bad("first name offset is not 0", l.name_offsets_at);
  }
  const char* names = reinterpret_cast<const char*>(data + l.names_at);
  uint64_t prev = 0;
  for (uint64_t i = 1; i <= m; ++i) {
    uint64_t no = Load<uint64_t>(data + l.name_offsets_at + 8 * i);
    if (no <= prev || no > n) {
      return Bad("name offset " + std::to_string(i) + " is out of order or range",
                 l.name_offsets_at + 8 * i);
    }
    if (KeyLength(names + prev, static_cast<size_t>(no - prev)) == SIZE_MAX ||
        std::memchr(names + prev, '\0', static_cast<size_t>(no - prev)) != nullptr) {
      return Bad("member " + std::to_string(i - 1) + " has no valid key.field name",
                 l.names_at + prev);
    }
    prev = no;
  }
  if (prev != n) return Bad("name offsets do not cover the string table", l.name_offsets_at);

  uint64_t expect_first = 0;
  for (uint64_t j = 0; j < s; ++j) {
    uint64_t first = Load<uint64_t>(data + l.sample_first_at + 8 * j);
    uint32_t count = Load<uint32_t>(data + l.sample_count_at + 4 * j);
    if (first != expect_first || count == 0 || count > m - first) {
      return Bad("sample " + std::to_string(j) + " has a bad member range",
                 l.sample_first_at + 8 * j);
    }
    // Every member of a sample shares the sample's key.
    uint64_t a = Load<uint64_t>(data + l.name_offsets_at + 8 * first);
    size_t key_len = KeyLength(names + a, static_cast<size_t>(
                                              Load<uint64_t>(data + l.name_offsets_at +
                                                             8 * (first + 1)) -
                                              a));
    for (uint64_t k = first + 1; k < first + count; ++k) {
      uint64_t b = Load<uint64_t>(data + l.name_offsets_at + 8 * k);
      uint64_t e = Load<uint64_t>(data + l.name_offsets_at + 8 * (k + 1));
      size_t kl = KeyLength(names + b, static_cast<size_t>(e - b));
      if (kl != key_len || std::memcmp(names + a, names + b, key_len) != 0) {
        return Bad("member " + std::to_string(k) + " does not share the key of sample " +
                       std::to_string(j),
                   l.sample_first_at + 8 * j);
      }
    }
    expect_first = first + count;
  }
  if (expect_first != m) return Bad("samples do not cover all members", l.sample_first_at);
  *layout = l;
  return Status::Ok();
}

Status ParseIndex(const uint8_t* data, size_t len, MemberTable* out) {
  out->clear();
  IndexLayout l;
  Status st = ValidateIndex(data, len, &l);
  if (!st.ok()) return st;
  const size_t m = static_cast<size_t>(l.num_members);
  const size_t s = static_cast<size_t>(l.num_samples);
  out->shard_size = l.shard_size;
  out->offsets.resize(m);
  out->sizes.resize(m);
  out->name_offsets.resize(m + 1);
  out->sample_first.resize(s);
  out->sample_count.resize(s);
  if (m) {
    std::memcpy(out->offsets.data(), data + l.offsets_at, 8 * m);
    std::memcpy(out->sizes.data(), data + l.sizes_at, 8 * m);
  }
  std::memcpy(out->name_offsets.data(), data + l.name_offsets_at, 8 * (m + 1));
  if (s) {
    std::memcpy(out->sample_first.data(), data + l.sample_first_at, 8 * s);
    std::memcpy(out->sample_count.data(), data + l.sample_count_at, 4 * s);
  }
  out->names.assign(reinterpret_cast<const char*>(data + l.names_at),
                    static_cast<size_t>(l.names_bytes));
  return Status::Ok();
}

Status DaliIndexText(const MemberTable& t, std::string* out) {
  out->clear();
  out->reserve(64 + t.names.size() * 2 + t.num_members() * 32);
  *out += "v1.2 " + std::to_string(t.num_samples()) + "\n";
  for (size_t j = 0; j < t.num_samples(); ++j) {
    uint64_t first = t.sample_first[j];
    for (uint64_t k = first; k < first + t.sample_count[j]; ++k) {
      std::string_view name(t.names.data() + t.name_offsets[k],
                            static_cast<size_t>(t.name_offsets[k + 1] - t.name_offsets[k]));
      for (char c : name) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
          out->clear();
          return Status::Error(ErrorCode::kUnsupported,
                               "member name '" + std::string(name) +
                                   "' contains whitespace, which DALI's index format cannot hold",
                               t.offsets[k]);
        }
      }
      size_t key_len = KeyLength(name.data(), name.size());
      if (k != first) *out += ' ';
      out->append(name.substr(key_len + 1));
      *out += ' ';
      *out += std::to_string(t.offsets[k]);
      *out += ' ';
      *out += std::to_string(t.sizes[k]);
      *out += ' ';
      out->append(name);
    }
    *out += '\n';
  }
  return Status::Ok();
}

}  // namespace fastload
