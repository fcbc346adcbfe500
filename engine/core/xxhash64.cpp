#include "engine/core/xxhash64.h"

#include <bit>        // std::endian, std::rotl
#include <cinttypes>  // PRIx64
#include <cstdio>
#include <cstdlib>
#include <cstring>  // std::memcpy

namespace gantry {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

// Only the big-endian branches below call these: [[maybe_unused]] keeps clang quiet on little-endian hosts.
[[maybe_unused]] constexpr uint64_t byte_swap64(uint64_t x) {
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out = (out << 8) | ((x >> (8 * i)) & 0xFF);
  return out;
}

[[maybe_unused]] constexpr uint32_t byte_swap32(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xFF00U) | ((x << 8) & 0xFF0000U) | (x << 24);
}

// XXH64 is defined over little-endian words; memcpy keeps unaligned loads free of undefined behaviour
// and compiles to a single load.
uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = byte_swap64(v);
  return v;
}

uint32_t load_le32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = byte_swap32(v);
  return v;
}

uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = std::rotl(acc, 31);
  return acc * kPrime1;
}

uint64_t merge_round(uint64_t hash, uint64_t acc) {
  hash ^= round(0, acc);
  return hash * kPrime1 + kPrime4;
}

void accumulators_init(uint64_t acc[4], uint64_t seed) {
  // Unsigned wrap-around is intended throughout: the algorithm is defined modulo 2^64.
  acc[0] = seed + kPrime1 + kPrime2;
  acc[1] = seed + kPrime2;
  acc[2] = seed;
  acc[3] = seed - kPrime1;
}

void stripe_consume(uint64_t acc[4], const unsigned char* stripe) {
  acc[0] = round(acc[0], load_le64(stripe));
  acc[1] = round(acc[1], load_le64(stripe + 8));
  acc[2] = round(acc[2], load_le64(stripe + 16));
  acc[3] = round(acc[3], load_le64(stripe + 24));
}

uint64_t accumulators_merge(const uint64_t acc[4]) {
  uint64_t h = std::rotl(acc[0], 1) + std::rotl(acc[1], 7) + std::rotl(acc[2], 12) + std::rotl(acc[3], 18);
  for (int i = 0; i < 4; ++i) h = merge_round(h, acc[i]);
  return h;
}

// Folds in the final (total_bytes % 32) bytes and mixes. `h` already holds the merged accumulators (or
// seed + prime5 for short inputs) plus the total length.
uint64_t tail_finish(uint64_t h, const unsigned char* p, size_t bytes) {
  while (bytes >= 8) {
    h ^= round(0, load_le64(p));
    h = std::rotl(h, 27) * kPrime1 + kPrime4;
    p += 8;
    bytes -= 8;
  }
  if (bytes >= 4) {
    h ^= static_cast<uint64_t>(load_le32(p)) * kPrime1;
    h = std::rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
    bytes -= 4;
  }
  while (bytes > 0) {
    h ^= static_cast<uint64_t>(*p) * kPrime5;
    h = std::rotl(h, 11) * kPrime1;
    ++p;
    --bytes;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t xxhash64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t total = bytes;
  uint64_t h;
  if (bytes >= 32) {
    uint64_t acc[4];
    accumulators_init(acc, seed);
    do {
      stripe_consume(acc, p);
      p += 32;
      bytes -= 32;
    } while (bytes >= 32);
    h = accumulators_merge(acc);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(total);
  return tail_finish(h, p, bytes);
}

void XxHash64Stream::reset(uint64_t seed) {
  seed_ = seed;
  total_bytes_ = 0;
  accumulators_init(acc_, seed);
  pending_bytes_ = 0;
}

void XxHash64Stream::update(const void* data, size_t bytes) {
  if (bytes == 0) return;  // data may be null then, and memcpy from null is undefined even for 0 bytes
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += bytes;

  if (pending_bytes_ > 0) {
    const size_t take = bytes < kStripeBytes - pending_bytes_ ? bytes : kStripeBytes - pending_bytes_;
    std::memcpy(pending_ + pending_bytes_, p, take);
    pending_bytes_ += take;
    p += take;
    bytes -= take;
    if (pending_bytes_ < kStripeBytes) return;
    stripe_consume(acc_, pending_);
    pending_bytes_ = 0;
  }
  while (bytes >= kStripeBytes) {
    stripe_consume(acc_, p);
    p += kStripeBytes;
    bytes -= kStripeBytes;
  }
  if (bytes > 0) {
    std::memcpy(pending_, p, bytes);
    pending_bytes_ = bytes;
  }
}

uint64_t XxHash64Stream::digest() const {
  // The one-shot form only uses the accumulators once a full stripe has been seen.
  uint64_t h = total_bytes_ >= kStripeBytes ? accumulators_merge(acc_) : seed_ + kPrime5;
  h += total_bytes_;
  return tail_finish(h, pending_, pending_bytes_);
}

std::string xxhash64_hex(uint64_t digest) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, digest);
  return buf;
}

bool xxhash64_parse_hex(const std::string& text, uint64_t* digest) {
  if (text.empty() || text.size() > 16) return false;
  char* end = nullptr;
  *digest = std::strtoull(text.c_str(), &end, 16);
  return end == text.c_str() + text.size();
}

}  // namespace gantry
