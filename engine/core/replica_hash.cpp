#include "engine/core/replica_hash.h"

#include <bit>  // std::endian
#include <cstring>

namespace gantry {

namespace {

// The word as little-endian bytes, whatever the host's order (the GPU reads them little-endian).
uint64_t load_le(const unsigned char* p, size_t n) {
  uint64_t w = 0;
  for (size_t k = 0; k < n; ++k) w |= static_cast<uint64_t>(p[k]) << (8 * k);
  return w;
}

}  // namespace

uint64_t replica_hash(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t words = bytes / 8, tail = bytes % 8;
  uint64_t sum = replica_hash_mix(static_cast<uint64_t>(bytes));
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&w, p + i * 8, 8);
    } else {
      w = load_le(p + i * 8, 8);
    }
    sum += replica_hash_term(i, w);
  }
  if (tail != 0) sum += replica_hash_term(words, load_le(p + words * 8, tail));
  return sum;
}

}  // namespace gantry
