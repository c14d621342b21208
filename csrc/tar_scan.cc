#include "tar_scan.h"

#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fastload {
namespace {

constexpr size_t kBlock = 512;
// GNU long names and PAX headers larger than this are refused: no real member
// path is this long, and it bounds the memory a hostile header can ask for.
constexpr uint64_t kMaxExtendedHeader = 1 << 20;

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Field bytes up to the first NUL (or the whole field).
std::string_view FieldString(const uint8_t* p, size_t n) {
  const void* nul = n ? std::memchr(p, 0, n) : nullptr;
  size_t len = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - p) : n;
  return std::string_view(reinterpret_cast<const char*>(p), len);
}

bool IsSpace(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Parses a numeric header field the way Python's tarfile does: GNU base-256
// when the first byte is 0x80 (0xff, negative, is refused), otherwise octal
// digits up to the first NUL with surrounding whitespace; empty means 0.
bool ParseNumber(const uint8_t* p, size_t n, uint64_t* out, bool* too_large) {
  *too_large = false;
  if (n == 0) return false;
  if (p[0] == 0x80 || p[0] == 0xff) {
    if (p[0] == 0xff) return false;
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v > (UINT64_MAX >> 8)) {
        *too_large = true;
        return false;
      }
      v = (v << 8) | p[i];
    }
    *out = v;
    return true;
  }
  size_t end = 0;
  while (end < n && p[end] != 0) ++end;
  size_t begin = 0;
  while (begin < end && IsSpace(p[begin])) ++begin;
  while (end > begin && IsSpace(p[end - 1])) --end;
  uint64_t v = 0;
  for (size_t i = begin; i < end; ++i) {
    if (p[i] < '0' || p[i] > '7') return false;
    if (v > (UINT64_MAX >> 3)) {
      *too_large = true;
      return false;
    }
    v = (v << 3) | static_cast<uint64_t>(p[i] - '0');
  }
  *out = v;
  return true;
}

bool ChecksumMatches(const uint8_t* h, uint64_t stored) {
  // Sum with the checksum field counted as spaces. This runs once per member
  // and is most of the scan's arithmetic, hence SAD where SSE2 is there.
  uint64_t unsigned_sum = 0;
#if defined(__SSE2__)
  __m128i acc = _mm_setzero_si128();
  const __m128i zero = _mm_setzero_si128();
  for (size_t i = 0; i < kBlock; i += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    acc = _mm_add_epi64(acc, _mm_sad_epu8(v, zero));
  }
  unsigned_sum = static_cast<uint64_t>(_mm_cvtsi128_si64(acc)) +
                 static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)));
#else
  for (size_t i = 0; i < kBlock; ++i) unsigned_sum += h[i];
#endif
  for (size_t i = 148; i < 156; ++i) unsigned_sum -= h[i];
  unsigned_sum += 8 * ' ';
  if (stored == unsigned_sum) return true;
  // Some old tars summed signed chars; tarfile accepts either.
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    signed_sum += (i >= 148 && i < 156) ? ' ' : static_cast<int8_t>(h[i]);
  }
  return signed_sum >= 0 && stored == static_cast<uint64_t>(signed_sum);
}

uint64_t HashKey(std::string_view key) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (char c : key) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

// Keys seen so far, stored as offsets into the table's name blob (which grows,
// so no pointers): open addressing, linear probing, no per-key allocation.
class KeySet {
 public:
  // The sample that already has `key`, or UINT64_MAX after recording it for
  // `sample` (its name will be appended to `names` at `name_off`).
  uint64_t FindOrInsert(std::string_view key, const std::string& names, uint64_t name_off,
                        uint64_t sample) {
    if ((used_ + 1) * 2 > slots_.size()) Grow();
    const uint64_t hash = HashKey(key);
    const size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (slot.sample_plus1 == 0) {
        slot = Slot{hash, name_off, key.size(), sample + 1};
        ++used_;
        return UINT64_MAX;
      }
      if (slot.hash == hash && slot.key_len == key.size() &&
          std::memcmp(names.data() + slot.name_off, key.data(), key.size()) == 0) {
        return slot.sample_plus1 - 1;
      }
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t name_off = 0;
    uint64_t key_len = 0;
    uint64_t sample_plus1 = 0;  // 0 marks an empty slot
  };

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.sample_plus1 == 0) continue;
      size_t i = static_cast<size_t>(s.hash) & mask;
      while (slots_[i].sample_plus1 != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t used_ = 0;
};

// Rounds a data size up to whole blocks; false on overflow.
bool Padded(uint64_t size, uint64_t* out) {
  if (size > UINT64_MAX - (kBlock - 1)) return false;
  *out = (size + kBlock - 1) / kBlock * kBlock;
  return true;
}

bool ParseDecimal(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;  // 19 digits always fit in u64
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

struct PaxOverrides {
  bool has_path = false;
  std::string path;
  bool has_size = false;
  uint64_t size = 0;
};

// Parses PAX records "<len> <key>=<value>\n" in [p, p + n). Trailing NUL
// padding is tolerated; anything else that is not a whole record is an error.
Status ParsePax(const uint8_t* p, size_t n, uint64_t base, PaxOverrides* pax) {
  size_t pos = 0;
  while (pos < n) {
    if (AllZero(p + pos, n - pos)) break;
    size_t digits_end = pos;
    while (digits_end < n && digits_end - pos < 20 && p[digits_end] >= '0' &&
           p[digits_end] <= '9') {
      ++digits_end;
    }
    uint64_t length = 0;
    std::string_view digits(reinterpret_cast<const char*>(p + pos), digits_end - pos);
    if (!ParseDecimal(digits, &length) || digits_end >= n || p[digits_end] != ' ') {
      return Status::Error(ErrorCode::kBadPax, "PAX record without a valid length",
                           base + pos);
    }
    // The record must hold "<len> k=\n" at least and end inside the header.
    if (length < digits.size() + 4 || length > n - pos) {
      return Status::Error(ErrorCode::kBadPax,
                           "PAX record length " + std::to_string(length) +
                               " does not fit the extended header",
                           base + pos);
    }
    size_t rec_end = pos + static_cast<size_t>(length);  // one past '\n'
    if (p[rec_end - 1] != '\n') {
      return Status::Error(ErrorCode::kBadPax, "PAX record does not end in a newline",
                           base + pos);
    }
    size_t kv = digits_end + 1;
    size_t eq = kv;
    while (eq < rec_end - 1 && p[eq] != '=') ++eq;
    if (eq == kv || eq >= rec_end - 1) {
      return Status::Error(ErrorCode::kBadPax, "PAX record without a keyword", base + pos);
    }
    std::string_view key(reinterpret_cast<const char*>(p + kv), eq - kv);
    std::string_view value(reinterpret_cast<const char*>(p + eq + 1), rec_end - 1 - (eq + 1));
    if (key == "path") {
      pax->has_path = true;
      pax->path.assign(value.data(), value.size());
    } else if (key == "size") {
      uint64_t v = 0;
      if (!ParseDecimal(value, &v)) {
        return Status::Error(ErrorCode::kBadPax,
                             "PAX size '" + std::string(value.substr(0, 32)) +
                                 "' is not a decimal number",
                             base + pos);
      }
      pax->has_size = true;
      pax->size = v;
    } else if (key.substr(0, 11) == "GNU.sparse.") {
      return Status::Error(ErrorCode::kRefusedMember, "sparse members are not supported",
                           base + pos);
    }
    pos = rec_end;
  }
  return Status::Ok();
}

// Why a path is unsafe, or nullptr.
const char* UnsafePathReason(std::string_view name) {
  if (name.empty()) return "empty member name";
  if (name.find('\0') != std::string_view::npos) return "NUL byte in member name";
  if (name[0] == '/') return "absolute member path";
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    size_t end = slash == std::string_view::npos ? name.size() : slash;
    if (name.substr(start, end - start) == "..") return "'..' component in member path";
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return nullptr;
}

std::string Quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 200)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  if (s.size() > 200) out += "...";
  out += "'";
  return out;
}

const char* TypeName(char t) {
  switch (t) {
    case '1': return "hard link";
    case '2': return "symbolic link";
    case '3': return "character device";
    case '4': return "block device";
    case '6': return "FIFO";
    case 'S': return "GNU sparse file";
    default: return nullptr;
  }
}

}  // namespace

void MemberTable::clear() {
  shard_size = 0;
  offsets.clear();
  sizes.clear();
  name_offsets.clear();
  names.clear();
  sample_first.clear();
  sample_count.clear();
}

size_t KeyLength(const char* name, size_t len) {
  std::string_view n(name, len);
  size_t slash = n.rfind('/');
  size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  if (slash == std::string_view::npos && len >= 4 && n.substr(0, 2) == "__" &&
      n.substr(len - 2) == "__") {
    return SIZE_MAX;  // webdataset metadata file
  }
  size_t dot = n.find('.', base);
  if (dot == std::string_view::npos || dot == base || dot + 1 == len) return SIZE_MAX;
  return dot;
}

Status ScanTar(const uint8_t* data, size_t len, MemberTable* out) {
  out->clear();
  out->shard_size = len;
  // Members take at least two blocks of the archive. Reserving for the densest
  // case costs only address space (untouched pages are never faulted in) and
  // saves the page faults of repeatedly growing large vectors.
  const size_t max_members = len / 1024 + 1;
  out->offsets.reserve(max_members);
  out->sizes.reserve(max_members);
  out->name_offsets.reserve(max_members + 1);
  out->sample_first.reserve(max_members);
  out->sample_count.reserve(max_members);
  out->name_offsets.push_back(0);

  PaxOverrides pax;
  bool has_pax = false;
  bool has_longname = false;
  std::string longname;
  uint64_t ext_start = 0;  // offset of the first extended header of the pending member

  // Grouping state: keys seen (for duplicate detection) and the current one.
  KeySet seen_keys;
  std::string current_key;
  bool have_current = false;
  std::string name;  // reused: no allocation per member once it has grown

  auto fail = [&](Status s) {
    out->clear();
    return s;
  };

  uint64_t pos = 0;
  while (true) {
    if (pos == len) break;  // EOF on a block boundary
    if (len - pos < kBlock) {
      return fail(Status::Error(ErrorCode::kTruncated,
                                "truncated header (" + std::to_string(len - pos) +
                                    " of 512 bytes)",
                                pos));
    }
    const uint8_t* h = data + pos;
    if (AllZero(h, kBlock)) break;  // end-of-archive marker

    uint64_t stored_sum = 0;
    bool too_large = false;
    if (!ParseNumber(h + 148, 8, &stored_sum, &too_large)) {
      return fail(Status::Error(ErrorCode::kBadHeader, "unparsable header checksum field", pos));
    }
    if (!ChecksumMatches(h, stored_sum)) {
      return fail(Status::Error(ErrorCode::kBadChecksum,
                                "header checksum mismatch (not a tar header?)", pos));
    }
    uint64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size, &too_large)) {
      return fail(Status::Error(too_large ? ErrorCode::kTooLarge : ErrorCode::kBadHeader,
                                too_large ? "member size does not fit 64 bits"
                                          : "unparsable member size field",
                                pos));
    }
    char type = static_cast<char>(h[156]);
    std::string_view raw_name = FieldString(h, 100);
    std::string_view magic(reinterpret_cast<const char*>(h + 257), 8);
    bool gnu_magic = magic == std::string_view("ustar  \0", 8);

    uint64_t data_off = pos + kBlock;
    bool is_extended = type == 'x' || type == 'g' || type == 'L' || type == 'K';
    // A PAX size applies to the member header that follows the extended ones.
    if (!is_extended && has_pax && pax.has_size) size = pax.size;
    uint64_t padded = 0;
    if (!Padded(size, &padded)) {
      return fail(Status::Error(ErrorCode::kTooLarge, "member size does not fit 64 bits", pos));
    }
    // Directories carry no data (tarfile does not skip any for them), so only
    // the other members are bounds-checked here.
    auto data_fits = [&]() { return padded <= len - data_off; };
    auto truncated = [&]() {
      return fail(Status::Error(ErrorCode::kTruncated,
                                "member data (" + std::to_string(size) +
                                    " bytes) runs past the end of the archive",
                                pos));
    };
    const uint8_t* body = data + data_off;

    if (is_extended) {
      if (!data_fits()) return truncated();
      if (!has_pax && !has_longname) ext_start = pos;
      if (size > kMaxExtendedHeader) {
        return fail(Status::Error(ErrorCode::kTooLarge,
                                  "extended header of " + std::to_string(size) +
                                      " bytes is too large",
                                  pos));
      }
      if (type == 'x') {
        Status s = ParsePax(body, static_cast<size_t>(size), data_off, &pax);
        if (!s.ok()) return fail(s);
        has_pax = true;
      } else if (type == 'L') {
        longname.assign(FieldString(body, static_cast<size_t>(size)));
        has_longname = true;
      }
      // 'g' (global PAX) and 'K' (long link name) carry nothing a shard uses.
      pos = data_off + padded;
      continue;
    }

    // A real member header.
    if (has_pax && pax.has_path) {
      name = pax.path;
    } else if (has_longname) {
      name = longname;
    } else {
      name.assign(raw_name);
      std::string_view prefix = FieldString(h + 345, 155);
      if (!gnu_magic && !prefix.empty()) {
        name.insert(0, "/");
        name.insert(0, prefix);
      }
    }
    uint64_t member_pos = (has_pax || has_longname) ? ext_start : pos;
    if (has_pax) pax = PaxOverrides();
    has_pax = false;
    has_longname = false;

    bool is_dir = type == '5' || (type == '\0' && !raw_name.empty() && raw_name.back() == '/');
    bool is_regular = !is_dir && (type == '0' || type == '\0' || type == '7');

    if (!is_dir && !is_regular) {
      if (type == 'V') {  // volume label: no data a shard could use
        if (!data_fits()) return truncated();
        pos = data_off + padded;
        continue;
      }
      const char* what = TypeName(type);
      std::string msg = what ? std::string(what) + " " + Quote(name) + " is not allowed in a shard"
                             : "unsupported member type " + Quote(std::string_view(&type, 1)) +
                                   " for " + Quote(name);
      return fail(Status::Error(ErrorCode::kRefusedMember, msg, member_pos));
    }
    std::string_view check_name = name;
    if (is_dir) {
      while (check_name.size() > 1 && check_name.back() == '/') check_name.remove_suffix(1);
    }
    if (const char* why = UnsafePathReason(check_name)) {
      return fail(Status::Error(ErrorCode::kUnsafePath, std::string(why) + " " + Quote(name),
                                member_pos));
    }
    if (is_dir) {
      // Like tarfile, a directory's size field is not taken as data to skip.
      pos = data_off;
      continue;
    }

    if (!data_fits()) return truncated();
    size_t key_len = KeyLength(name.data(), name.size());
    if (key_len != SIZE_MAX) {
      std::string_view key(name.data(), key_len);
      std::string_view field(name.data() + key_len + 1, name.size() - key_len - 1);
      if (have_current && key == current_key) {
        uint64_t first = out->sample_first.back();
        for (uint64_t m = first; m < out->num_members(); ++m) {
          const char* other = out->names.data() + out->name_offsets[m];
          size_t other_len = static_cast<size_t>(out->name_offsets[m + 1] - out->name_offsets[m]);
          if (std::string_view(other + key_len + 1, other_len - key_len - 1) == field) {
            return fail(Status::Error(ErrorCode::kDuplicateField,
                                      "duplicate field " + Quote(field) + " in sample " +
                                          Quote(key),
                                      member_pos));
          }
        }
        out->sample_count.back() += 1;
      } else {
        uint64_t earlier =
            seen_keys.FindOrInsert(key, out->names, out->names.size(), out->num_samples());
        if (earlier != UINT64_MAX) {
          return fail(Status::Error(ErrorCode::kDuplicateKey,
                                    "duplicate key " + Quote(key) + " (sample " +
                                        std::to_string(earlier) + " has it too, not adjacent)",
                                    member_pos));
        }
        current_key.assign(key);
        have_current = true;
        out->sample_first.push_back(out->num_members());
        out->sample_count.push_back(1);
      }
      out->offsets.push_back(data_off);
      out->sizes.push_back(size);
      out->names += name;
      out->name_offsets.push_back(out->names.size());
    }
    pos = data_off + padded;
  }
  if (has_pax || has_longname) {
    return fail(Status::Error(ErrorCode::kTruncated,
                              "extended header is not followed by a member header", ext_start));
  }
  return Status::Ok();
}

}  // namespace fastload
