#include "tar_scan.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
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

// Whether [p, p + n) holds only NULs. Word at a time: the ~200 NUL bytes after
// every member's name and in its empty ustar prefix are checked per header.
bool AllZero(const uint8_t* p, size_t n) {
  size_t i = 0;
  uint64_t acc = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    acc |= w[0] | w[1] | w[2] | w[3];
    if (acc != 0) return false;
  }
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc |= w;
  }
  for (; i < n; ++i) acc |= p[i];
  return acc == 0;
}

// Asks for the 8 cache lines of a header block at once: the headers of a shard lie
// kilobytes apart, so each is a cold read, and its lines are then fetched in parallel
// instead of one miss after another.
inline void PrefetchBlock(const uint8_t* p) {
#if defined(__GNUC__)
  for (size_t i = 0; i < kBlock; i += 64) __builtin_prefetch(p + i);
#else
  (void)p;
#endif
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

// The numeric fields fastload does not use (mode, uid, gid, mtime, devmajor,
// devminor) must still parse, as tarfile requires: where one does not, tarfile
// ends the archive there without a word, and the two would read different members.
const char* BadUnusedNumber(const uint8_t* h) {
  static const struct {
    size_t at, len;
    const char* name;
  } kFields[] = {{100, 8, "mode"},    {108, 8, "uid"},       {116, 8, "gid"},
                 {136, 12, "mtime"},  {329, 8, "devmajor"},  {337, 8, "devminor"}};
  for (const auto& f : kFields) {
    if (h[f.at] == 0x80 || h[f.at] == 0xff) continue;  // base-256, negative allowed here
    uint64_t v = 0;
    bool too_large = false;
    if (!ParseNumber(h + f.at, f.len, &v, &too_large)) return f.name;
  }
  return nullptr;
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

// SipHash-1-3 with a per-scan random key: names from the archive choose the
// slots of the hash sets, and a keyed hash means no crafted set of names can
// make them collide (FNV could be flooded: 8,000 colliding keys took 20x as long).
inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipKey {
  uint64_t k0 = 0, k1 = 0;
};

SipKey RandomSipKey() {
  static std::atomic<uint64_t> counter{0};
  SipKey k;
  try {
    std::random_device rd;
    k.k0 = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    k.k1 = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {
    // no entropy source: still keyed by time and address, never constant
  }
  uint64_t mix = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  k.k0 ^= mix ^ reinterpret_cast<uintptr_t>(&k);
  k.k1 ^= Rotl(mix, 29) ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  return k;
}

uint64_t SipHash13(const SipKey& key, const char* p, size_t n) {
  uint64_t v0 = 0x736f6d6570736575ull ^ key.k0, v1 = 0x646f72616e646f6dull ^ key.k1;
  uint64_t v2 = 0x6c7967656e657261ull ^ key.k0, v3 = 0x7465646279746573ull ^ key.k1;
  auto round = [&]() {
    v0 += v1; v1 = Rotl(v1, 13); v1 ^= v0; v0 = Rotl(v0, 32);
    v2 += v3; v3 = Rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = Rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = Rotl(v1, 17); v1 ^= v2; v2 = Rotl(v2, 32);
  };
  const size_t whole = n & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m;
    std::memcpy(&m, p + i, 8);  // little-endian hosts; the hash only picks slots
    v3 ^= m;
    round();
    v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(n) << 56;
  for (size_t i = whole; i < n; ++i) {
    last |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * (i - whole));
  }
  v3 ^= last;
  round();
  v0 ^= last;
  v2 ^= 0xff;
  round();
  round();
  round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// Strings seen so far, stored as (offset, length) into the table's name blob
// (which grows, so no pointers): open addressing, linear probing, no per-string
// allocation. Used for the keys of a shard and for the fields of a big sample.
class NameSet {
 public:
  explicit NameSet(const SipKey& key, size_t initial = 64) : key_(key), initial_(initial) {}

  // The value stored with `s`, or UINT64_MAX after recording `s` (which is, or
  // will be, at `name_off` in `names`) with `value`.
  uint64_t FindOrInsert(std::string_view s, const std::string& names, uint64_t name_off,
                        uint64_t value) {
    if ((used_ + 1) * 2 > slots_.size()) Grow();
    const uint64_t hash = SipHash13(key_, s.data(), s.size());
    const size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (slot.value_plus1 == 0) {
        slot = Slot{hash, name_off, s.size(), value + 1};
        ++used_;
        return UINT64_MAX;
      }
      if (slot.hash == hash && slot.len == s.size() &&
          std::memcmp(names.data() + slot.name_off, s.data(), s.size()) == 0) {
        return slot.value_plus1 - 1;
      }
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t name_off = 0;
    uint64_t len = 0;
    uint64_t value_plus1 = 0;  // 0 marks an empty slot
  };

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? initial_ : old.size() * 2, Slot{});
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.value_plus1 == 0) continue;
      size_t i = static_cast<size_t>(s.hash) & mask;
      while (slots_[i].value_plus1 != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  SipKey key_;
  size_t initial_;
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
  // webdataset's metadata: a top-level "__*__" file or anything in a "__*__/" directory
  std::string_view top = n.substr(0, n.find('/'));
  if (top.size() >= 4 && top.substr(0, 2) == "__" && top.substr(top.size() - 2) == "__") {
    return SIZE_MAX;
  }
  size_t slash = n.rfind('/');
  size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  size_t dot = n.find('.', base);
  if (dot == std::string_view::npos || dot == base || dot + 1 == len) return SIZE_MAX;
  return dot;
}

namespace {

// Whether a NUL in [p, p + n) is followed by anything but NULs: a name with a
// NUL inside, which tarfile would silently cut short.
bool NulInside(const uint8_t* p, size_t n) {
  const void* nul = n ? std::memchr(p, 0, n) : nullptr;
  if (nul == nullptr) return false;
  size_t at = static_cast<size_t>(static_cast<const uint8_t*>(nul) - p);
  return !AllZero(p + at, n - at);
}

}  // namespace

bool HeaderParser::Next(Member* m, Status* st) {
  *st = Status::Ok();
  const uint64_t len = src_->size();
  bool pending = false;  // extended headers seen for the coming member
  uint64_t ext_start = 0;
  bool name_set = false;  // the first extended name (GNU long name or PAX path) wins
  std::string ext_name;
  bool size_set = false;  // and so does the first PAX size
  uint64_t ext_size = 0;
  bool global_pending = false;  // a global header must be followed by a member too
  uint64_t global_start = 0;
  auto dangling = [&]() {
    *st = Status::Error(ErrorCode::kTruncated,
                        "extended header is not followed by a member header",
                        pending ? ext_start : global_start);
    return false;
  };

  while (true) {
    if (pos_ == len) {
      if (pending || global_pending) return dangling();
      *st = Status::Error(
          ErrorCode::kTruncated,
          len == 0 ? std::string("empty file: not a tar archive (no end-of-archive block)")
                   : "no end-of-archive block: the archive stops after " + std::to_string(len) +
                         " bytes, on a block boundary (cut short?)",
          pos_);
      return false;
    }
    if (len - pos_ < kBlock) {
      *st = Status::Error(ErrorCode::kTruncated,
                          "truncated header (" + std::to_string(len - pos_) + " of 512 bytes)",
                          pos_);
      return false;
    }
    const uint8_t* h = src_->Read(pos_, kBlock, st);
    if (h == nullptr) return false;
    PrefetchBlock(h);
    {
      // The next header is a cold read kilobytes ahead: start fetching it before this
      // one is checked and grouped (only a hint: a wrong guess, such as a PAX size
      // overriding this field, costs nothing but the fetch).
      uint64_t hint_size = 0, hint_padded = 0;
      bool hint_large = false;
      if (ParseNumber(h + 124, 12, &hint_size, &hint_large) && Padded(hint_size, &hint_padded) &&
          hint_padded <= len - pos_ - kBlock && len - pos_ - kBlock - hint_padded >= kBlock) {
        src_->WillRead(pos_ + kBlock + hint_padded);
      }
    }
    if (AllZero(h, kBlock)) {
      if (pending || global_pending) return dangling();
      return false;  // end-of-archive marker
    }

    uint64_t stored_sum = 0;
    bool too_large = false;
    if (!ParseNumber(h + 148, 8, &stored_sum, &too_large)) {
      *st = Status::Error(ErrorCode::kBadHeader, "unparsable header checksum field", pos_);
      return false;
    }
    if (!ChecksumMatches(h, stored_sum)) {
      *st = Status::Error(ErrorCode::kBadChecksum, "header checksum mismatch (not a tar header?)",
                          pos_);
      return false;
    }
    if (const char* field = BadUnusedNumber(h)) {
      *st = Status::Error(ErrorCode::kBadHeader,
                          std::string("unparsable ") + field + " field in the header", pos_);
      return false;
    }
    uint64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size, &too_large)) {
      *st = Status::Error(too_large ? ErrorCode::kTooLarge : ErrorCode::kBadHeader,
                          too_large ? "member size does not fit 64 bits"
                                    : "unparsable member size field",
                          pos_);
      return false;
    }
    const char type = static_cast<char>(h[156]);
    // Views into `h`, which stays valid until the next Read: only an extended
    // header's body is read before the next header, and that path does not use them.
    const std::string_view raw_name = FieldString(h, 100);
    // Like tarfile, the ustar prefix field is joined to the name whatever the
    // magic (an old GNU header's atime there would be read as a prefix by both).
    const std::string_view prefix = FieldString(h + 345, 155);
    const bool name_nul = NulInside(h, 100) || NulInside(h + 345, 155);

    const uint64_t data_off = pos_ + kBlock;
    const bool is_extended = type == 'x' || type == 'g' || type == 'L' || type == 'K';
    // A PAX size applies to the member header that follows the extended ones.
    if (!is_extended && size_set) size = ext_size;
    uint64_t padded = 0;
    if (!Padded(size, &padded)) {
      *st = Status::Error(ErrorCode::kTooLarge, "member size does not fit 64 bits", pos_);
      return false;
    }
    // Directories carry no data (tarfile does not skip any for them), so only
    // the other members are bounds-checked.
    const bool fits = padded <= len - data_off;
    auto truncated = [&]() {
      *st = Status::Error(ErrorCode::kTruncated,
                          "member data (" + std::to_string(size) +
                              " bytes) runs past the end of the archive",
                          pos_);
      return false;
    };

    if (is_extended) {
      if (!fits) return truncated();
      if (size > kMaxExtendedHeader) {
        *st = Status::Error(ErrorCode::kTooLarge,
                            "extended header of " + std::to_string(size) + " bytes is too large",
                            pos_);
        return false;
      }
      if (type != 'g' && !pending) {
        pending = true;
        ext_start = pos_;
      }
      if (type == 'g' && !global_pending) {
        global_pending = true;
        global_start = pos_;
      }
      const uint8_t* body = size ? src_->Read(data_off, static_cast<size_t>(size), st) : h;
      if (body == nullptr) return false;
      if (type == 'x' || type == 'g') {
        PaxOverrides pax;
        Status ps = ParsePax(body, static_cast<size_t>(size), data_off, &pax);
        if (!ps.ok()) {
          *st = ps;
          return false;
        }
        if (type == 'g') {
          if (pax.has_path || pax.has_size) {
            *st = Status::Error(ErrorCode::kRefusedMember,
                                std::string("global PAX header sets '") +
                                    (pax.has_path ? "path" : "size") +
                                    "' (tarfile would apply it to every member)",
                                pos_);
            return false;
          }
        } else {
          if (pax.has_path && !name_set) {
            name_set = true;
            ext_name = pax.path;
            while (!ext_name.empty() && ext_name.back() == '/') ext_name.pop_back();  // as tarfile
          }
          if (pax.has_size && !size_set) {
            size_set = true;
            ext_size = pax.size;
          }
        }
      } else if (type == 'L') {
        if (NulInside(body, static_cast<size_t>(size))) {
          *st = Status::Error(ErrorCode::kUnsafePath,
                              "NUL byte inside GNU long name " +
                                  Quote(FieldString(body, static_cast<size_t>(size))),
                              pos_);
          return false;
        }
        if (!name_set) {
          name_set = true;
          ext_name.assign(FieldString(body, static_cast<size_t>(size)));
        }
      }
      // 'K' (long link name) carries nothing a shard uses.
      pos_ = data_off + padded;
      continue;
    }

    // A real member header.
    global_pending = false;
    const uint64_t member_pos = pending ? ext_start : pos_;
    std::string& name = m->name;
    if (name_set) {
      name = ext_name;
    } else {
      if (name_nul) {
        *st = Status::Error(ErrorCode::kUnsafePath,
                            "NUL byte inside member name " + Quote(raw_name), member_pos);
        return false;
      }
      if (prefix.empty()) {
        name.assign(raw_name);
      } else {
        name.assign(prefix);
        name += '/';
        name += raw_name;
      }
    }
    const bool is_dir = type == '5' || (type == '\0' && !raw_name.empty() && raw_name.back() == '/');
    const bool is_regular = !is_dir && (type == '0' || type == '\0' || type == '7');

    if (!is_dir && !is_regular) {
      if (type == 'V') {  // volume label: no data a shard could use
        if (!fits) return truncated();
        pos_ = data_off + padded;
        pending = name_set = size_set = false;
        continue;
      }
      const char* what = TypeName(type);
      std::string msg = what ? std::string(what) + " " + Quote(name) + " is not allowed in a shard"
                             : "unsupported member type " + Quote(std::string_view(&type, 1)) +
                                   " for " + Quote(name);
      *st = Status::Error(ErrorCode::kRefusedMember, msg, member_pos);
      return false;
    }
    std::string_view check_name = name;
    if (is_dir) {
      while (check_name.size() > 1 && check_name.back() == '/') check_name.remove_suffix(1);
    }
    if (const char* why = UnsafePathReason(check_name)) {
      *st = Status::Error(ErrorCode::kUnsafePath, std::string(why) + " " + Quote(name), member_pos);
      return false;
    }
    if (is_dir) {
      // Like tarfile, a directory's size field is not taken as data to skip.
      pos_ = data_off;
      pending = name_set = size_set = false;
      continue;
    }
    if (!fits) return truncated();
    m->header_offset = member_pos;
    m->data_offset = data_off;
    m->size = size;
    pos_ = data_off + padded;
    return true;
  }
}

struct SampleGrouper::Impl {
  explicit Impl(MemberTable* t) : out(t), key(RandomSipKey()), keys(key, 1024) {}
  MemberTable* out;
  SipKey key;
  NameSet keys;                     // every key so far -> its sample
  std::unique_ptr<NameSet> fields;  // the current sample's fields, once it is big
  std::string current_key;
  bool have_current = false;
};

// Samples up to this many fields are checked for a repeated field by a scan.
constexpr uint32_t kScanFields = 16;

SampleGrouper::SampleGrouper(MemberTable* out) : impl_(new Impl(out)) {}
SampleGrouper::~SampleGrouper() { delete impl_; }

Status SampleGrouper::Add(const Member& m) {
  Impl& g = *impl_;
  MemberTable* out = g.out;
  const std::string& name = m.name;
  const size_t key_len = KeyLength(name.data(), name.size());
  if (key_len == SIZE_MAX) return Status::Ok();
  std::string_view key(name.data(), key_len);
  std::string_view field(name.data() + key_len + 1, name.size() - key_len - 1);
  if (field.substr(0, 2) == "__") {
    return Status::Error(ErrorCode::kReservedField,
                         "field " + Quote(field) + " of sample " + Quote(key) +
                             " starts with '__' (reserved for metadata such as __key__)",
                         m.header_offset);
  }
  const uint64_t name_off = out->names.size();  // where this member's name will go
  if (g.have_current && key == g.current_key) {
    const uint32_t count = out->sample_count.back();
    if (count >= kMaxFields) {
      return Status::Error(ErrorCode::kTooManyFields,
                           "sample " + Quote(key) + " has more than " +
                               std::to_string(kMaxFields) + " fields",
                           m.header_offset);
    }
    const uint64_t first = out->sample_first.back();
    auto field_of = [&](uint64_t mem) {
      const uint64_t a = out->name_offsets[mem] + key_len + 1;
      return std::string_view(out->names.data() + a,
                              static_cast<size_t>(out->name_offsets[mem + 1] - a));
    };
    bool duplicate = false;
    if (count < kScanFields) {
      for (uint64_t mem = first; mem < first + count && !duplicate; ++mem) {
        duplicate = field_of(mem) == field;
      }
    } else {
      if (!g.fields) {
        g.fields.reset(new NameSet(g.key));
        for (uint64_t mem = first; mem < first + count; ++mem) {
          g.fields->FindOrInsert(field_of(mem), out->names, out->name_offsets[mem] + key_len + 1,
                                 0);
        }
      }
      duplicate = g.fields->FindOrInsert(field, out->names, name_off + key_len + 1, 0) !=
                  UINT64_MAX;
    }
    if (duplicate) {
      return Status::Error(ErrorCode::kDuplicateField,
                           "duplicate field " + Quote(field) + " in sample " + Quote(key),
                           m.header_offset);
    }
    out->sample_count.back() += 1;
  } else {
    const uint64_t earlier = g.keys.FindOrInsert(key, out->names, name_off, out->num_samples());
    if (earlier != UINT64_MAX) {
      return Status::Error(ErrorCode::kDuplicateKey,
                           "duplicate key " + Quote(key) + " (sample " + std::to_string(earlier) +
                               " has it too, not adjacent)",
                           m.header_offset);
    }
    g.fields.reset();
    g.current_key.assign(key);
    g.have_current = true;
    out->sample_first.push_back(out->num_members());
    out->sample_count.push_back(1);
  }
  out->offsets.push_back(m.data_offset);
  out->sizes.push_back(m.size);
  out->names += name;
  out->name_offsets.push_back(out->names.size());
  return Status::Ok();
}

Status ScanSource(ByteSource* src, MemberTable* out) {
  out->clear();
  const uint64_t len = src->size();
  out->shard_size = len;
  // Members take at least two blocks of the archive. Reserving for the densest
  // case costs only address space (untouched pages are never faulted in) and
  // saves the page faults of repeatedly growing large vectors.
  const size_t max_members = static_cast<size_t>(len / 1024 + 1);
  out->offsets.reserve(max_members);
  out->sizes.reserve(max_members);
  out->name_offsets.reserve(max_members + 1);
  out->sample_first.reserve(max_members);
  out->sample_count.reserve(max_members);
  out->name_offsets.push_back(0);

  HeaderParser parser(src);
  SampleGrouper grouper(out);
  Member member;
  Status st;
  while (parser.Next(&member, &st)) {
    st = grouper.Add(member);
    if (!st.ok()) break;
  }
  if (!st.ok()) {
    out->clear();
    return st;
  }
  out->shard_size = len;
  return Status::Ok();
}

Status ScanTar(const uint8_t* data, size_t len, MemberTable* out) {
  MemorySource src(data, len);
  return ScanSource(&src, out);
}

}  // namespace fastload
