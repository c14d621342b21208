// A small mutation-based driver for compilers without libFuzzer (g++): loads a
// seed corpus, mutates inputs (tar-aware: header fields, checksums, PAX text),
// and runs LLVMFuzzerTestOneInput until the time budget is spent. Sanitizer
// reports abort the process; the input being run is saved to crash-<pid>.tar.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" void __sanitizer_set_death_callback(void (*callback)(void));

namespace {

std::vector<uint8_t> g_current;

void SaveCurrent() {
  std::string name = "crash-" + std::to_string(getpid()) + ".tar";
  std::ofstream(name, std::ios::binary)
      .write(reinterpret_cast<const char*>(g_current.data()),
             static_cast<std::streamsize>(g_current.size()));
  std::fprintf(stderr, "saved the crashing input to %s\n", name.c_str());
}

void FixChecksum(std::vector<uint8_t>& d, size_t at) {
  if (at + 512 > d.size()) return;
  std::memset(&d[at + 148], ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < 512; ++i) sum += d[at + i];
  std::snprintf(reinterpret_cast<char*>(&d[at + 148]), 8, "%06o", sum);
  d[at + 155] = ' ';
}

const char* const kTokens[] = {"ustar\0" "00", "ustar  \0", "path=", "size=", " ", "\n",
                               "99999999999", "\x80\xff\xff\xff", "..", "/", ".", "__",
                               "GNU.sparse.major=", "0", "x", "L", "K", "g", "5", "2"};

void Mutate(std::vector<uint8_t>& d, std::mt19937_64& rng, const std::vector<std::vector<uint8_t>>& corpus) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 10) {
      case 0: if (!d.empty()) d[pick(d.size())] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 1: if (!d.empty()) d[pick(d.size())] = static_cast<uint8_t>(rng()); break;
      case 2: d.resize(pick(d.size() + 1)); break;
      case 3: {  // overwrite a header field with a token, then fix the checksum
        if (d.size() < 512) break;
        size_t block = pick(d.size() / 512) * 512;
        static const size_t kFields[] = {0, 124, 156, 257, 345, 100};
        size_t at = block + kFields[pick(6)];
        const char* tok = kTokens[pick(sizeof(kTokens) / sizeof(kTokens[0]))];
        size_t n = std::strlen(tok) ? std::strlen(tok) : 1;
        for (size_t i = 0; i < n && at + i < d.size(); ++i) d[at + i] = static_cast<uint8_t>(tok[i]);
        FixChecksum(d, block);
        break;
      }
      case 4: {  // insert a token anywhere
        const char* tok = kTokens[pick(sizeof(kTokens) / sizeof(kTokens[0]))];
        d.insert(d.begin() + static_cast<long>(pick(d.size() + 1)), tok, tok + std::strlen(tok));
        break;
      }
      case 5: {  // splice with another corpus entry at a block boundary
        const auto& other = corpus[pick(corpus.size())];
        size_t cut = pick(d.size() / 512 + 1) * 512;
        size_t from = pick(other.size() / 512 + 1) * 512;
        d.resize(std::min(cut, d.size()));
        if (from < other.size()) d.insert(d.end(), other.begin() + static_cast<long>(from), other.end());
        break;
      }
      case 6: if (d.size() >= 512) FixChecksum(d, pick(d.size() / 512) * 512); break;
      case 7: {  // random size field, base-256 or octal
        if (d.size() < 512) break;
        size_t block = pick(d.size() / 512) * 512;
        if (rng() % 2) {
          d[block + 124] = 0x80;
          for (int i = 1; i < 12; ++i) d[block + 124 + i] = static_cast<uint8_t>(rng() % 3 ? 0 : rng());
        } else {
          std::snprintf(reinterpret_cast<char*>(&d[block + 124]), 12, "%011llo",
                        static_cast<unsigned long long>(rng() % (1ull << 33)));
        }
        FixChecksum(d, block);
        break;
      }
      case 8: {  // erase a range
        if (d.empty()) break;
        size_t a = pick(d.size()), n = pick(std::min<size_t>(d.size() - a, 1024) + 1);
        d.erase(d.begin() + static_cast<long>(a), d.begin() + static_cast<long>(a + n));
        break;
      }
      default: {  // duplicate a block
        if (d.size() < 512) break;
        size_t block = pick(d.size() / 512) * 512;
        std::vector<uint8_t> copy(d.begin() + static_cast<long>(block), d.begin() + static_cast<long>(block + 512));
        d.insert(d.begin() + static_cast<long>(pick(d.size() / 512 + 1) * 512), copy.begin(), copy.end());
      }
    }
  }
  if (d.size() > (1u << 20)) d.resize(1u << 20);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SECONDS CORPUS_DIR...\n", argv[0]);
    return 2;
  }
  double budget = std::atof(argv[1]);
  std::vector<std::vector<uint8_t>> corpus;
  for (int a = 2; a < argc; ++a) {
    DIR* dir = opendir(argv[a]);
    if (!dir) continue;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string(argv[a]) + "/" + e->d_name, std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    closedir(dir);
  }
  if (corpus.empty()) corpus.emplace_back();
  __sanitizer_set_death_callback(SaveCurrent);
  std::mt19937_64 rng(std::random_device{}());
  auto start = std::chrono::steady_clock::now();
  unsigned long long execs = 0;
  for (const auto& seed : corpus) {  // every seed unmutated first
    g_current = seed;
    LLVMFuzzerTestOneInput(g_current.data(), g_current.size());
    ++execs;
  }
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget) {
    for (int i = 0; i < 256; ++i) {
      g_current = corpus[static_cast<size_t>(rng() % corpus.size())];
      Mutate(g_current, rng, corpus);
      LLVMFuzzerTestOneInput(g_current.data(), g_current.size());
      ++execs;
    }
  }
  std::printf("standalone driver: %llu execs in %.0f s over %zu seeds, no crash\n", execs, budget,
              corpus.size());
  return 0;
}
