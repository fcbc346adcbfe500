// XXH64, the 64-bit xxHash, implemented here because the GPU machines lack libxxhash. Used to fingerprint
// token shards and checkpoints; the output is bit-identical to the reference XXH64 for every input and seed,
// on any host byte order.
//
//   uint64_t h = xxhash64(bytes.data(), bytes.size());          // one shot
//
//   XxHash64Stream stream(/*seed=*/0);                          // the same value, fed in pieces
//   while (size_t n = read_some(buf, sizeof buf)) stream.update(buf, n);
//   uint64_t same = stream.digest();
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gantry {

// Hashes `bytes` bytes at `data` (any alignment; `data` may be null when `bytes` is 0).
uint64_t xxhash64(const void* data, size_t bytes, uint64_t seed = 0);

// A digest as manifests and caches write it (16 lower-case hex digits), and back; false for anything else.
std::string xxhash64_hex(uint64_t digest);
bool xxhash64_parse_hex(const std::string& text, uint64_t* digest);

// Incremental XXH64: any sequence of update() calls gives the same digest as one xxhash64() call over the
// concatenated bytes. digest() does not end the stream; more updates may follow.
class XxHash64Stream {
 public:
  explicit XxHash64Stream(uint64_t seed = 0) { reset(seed); }

  // Starts over, as if newly constructed with `seed`.
  void reset(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  static constexpr size_t kStripeBytes = 32;

  uint64_t seed_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t acc_[4] = {};
  // Bytes of an incomplete stripe; always total_bytes_ % 32 of them.
  unsigned char pending_[kStripeBytes] = {};
  size_t pending_bytes_ = 0;
};

}  // namespace gantry
