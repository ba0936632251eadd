// Seed corpora: every harness can write its own seeds, built with the same encoders the code under
// test uses, so fuzz/corpus/ holds real messages rather than hand-typed bytes.
//
//   COMM_FUZZ_SEEDS=fuzz/corpus/fuzz_codec build-fuzz/fuzz/fuzz_codec
//
// writes seed-00, seed-01, ... into the directory and exits (scripts/fuzz.sh seeds does it for
// every harness). A harness defines make_seeds() and calls write_seeds_if_asked() from
// LLVMFuzzerInitialize.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace comm::fuzz {

/// One seed input.
using seed = std::vector<uint8_t>;

/// Appends the bytes of `size` bytes at `data` to `out`.
inline void append(seed& out, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + size);
}

/// The bytes of a Cap'n Proto message as libcomm puts it on the wire (a flat array).
inline seed flat(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  seed out;
  append(out, words.begin(), words.size() * sizeof(capnp::word));
  return out;
}

/// When COMM_FUZZ_SEEDS names a directory, writes `make()`'s seeds there and exits.
template <class Make>
void write_seeds_if_asked(Make make) {
  const char* dir = std::getenv("COMM_FUZZ_SEEDS");
  if (dir == nullptr) return;
  const std::vector<seed> seeds = make();
  for (size_t i = 0; i < seeds.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "/seed-%02zu", i);
    const std::string path = std::string(dir) + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(seeds[i].data(), 1, seeds[i].size(), f) != seeds[i].size()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
    std::fclose(f);
  }
  std::printf("%zu seeds written to %s\n", seeds.size(), dir);
  std::exit(0);
}

}  // namespace comm::fuzz
