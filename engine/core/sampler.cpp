#include "engine/core/sampler.h"

#include <bit>

namespace gantry {
namespace {

// splitmix64's output function: a bijection on 64 bits with full avalanche, written out here so that the
// order is the same on every compiler and standard library.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t low_mask(int bits) {
  return bits >= 64 ? ~0ull : (1ull << bits) - 1;
}

constexpr int kRounds = 4;

// One pass of the Feistel network over [0, 2^(hi_bits + lo_bits)). When the bit count is odd the halves
// differ by one bit; each round swaps them, so their widths alternate and after an even number of rounds
// they are back where they started. Every round is invertible, so the whole is a bijection.
uint64_t feistel(uint64_t x, int hi_bits, int lo_bits, const uint64_t (&keys)[kRounds]) {
  uint64_t left = x >> lo_bits;
  uint64_t right = x & low_mask(lo_bits);
  int left_bits = hi_bits;
  int right_bits = lo_bits;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t next_right = (left ^ mix64(right ^ keys[r])) & low_mask(left_bits);
    left = right;
    right = next_right;
    int t = left_bits;
    left_bits = right_bits;
    right_bits = t;
  }
  return left << lo_bits | right;
}

}  // namespace

uint64_t sampler_permute(uint64_t position, uint64_t n, uint64_t seed, uint64_t epoch) {
  if (n <= 1) return 0;
  const int bits = std::bit_width(n - 1);  // the smallest power of two >= n is 2^bits
  const int hi_bits = (bits + 1) / 2;
  const int lo_bits = bits / 2;
  uint64_t keys[kRounds];
  const uint64_t base = mix64(mix64(seed) ^ epoch);
  for (int r = 0; r < kRounds; ++r) keys[r] = mix64(base + static_cast<uint64_t>(r));
  // Cycle-walking: the Feistel permutes the power-of-two domain; following its cycle from `position` until
  // it lands back inside [0, n) gives a permutation of [0, n). The domain is under 2n, so on average fewer
  // than two passes are needed, and the walk ends because the cycle holds `position` itself.
  uint64_t x = position;
  do {
    x = feistel(x, hi_bits, lo_bits, keys);
  } while (x >= n);
  return x;
}

uint64_t sampler_window(uint64_t seed, uint64_t global_index, uint64_t num_windows) {
  if (num_windows == 0) return 0;
  return sampler_permute(global_index % num_windows, num_windows, seed, global_index / num_windows);
}

uint64_t sampler_epoch(uint64_t global_index, uint64_t num_windows) {
  return num_windows == 0 ? 0 : global_index / num_windows;
}

SampleRange sampler_micro_batch(uint64_t step, int global_batch, int dp_size, int dp_rank, int micro_batch,
                                int micro_index) {
  if (global_batch <= 0 || dp_size <= 0 || dp_rank < 0 || dp_rank >= dp_size || micro_batch <= 0 ||
      micro_index < 0) {
    return {0, 0};
  }
  const uint64_t g = static_cast<uint64_t>(global_batch);
  const uint64_t per_rank = g / static_cast<uint64_t>(dp_size);
  const uint64_t offset = static_cast<uint64_t>(micro_index) * static_cast<uint64_t>(micro_batch);
  const uint64_t first = step * g + static_cast<uint64_t>(dp_rank) * per_rank + offset;
  if (offset >= per_rank) return {first, 0};
  const uint64_t count = per_rank - offset < static_cast<uint64_t>(micro_batch)
                             ? per_rank - offset
                             : static_cast<uint64_t>(micro_batch);
  return {first, count};
}

uint64_t sampler_batch(uint64_t step, const std::vector<SkippedBatches>& skipped) {
  uint64_t b = step;
  for (const SkippedBatches& r : skipped) {
    if (r.first > b) break;
    b += r.count;
  }
  return b;
}

void sampler_skip_batch(std::vector<SkippedBatches>& skipped, uint64_t index) {
  for (const SkippedBatches& r : skipped) {
    if (index >= r.first && index < r.first + r.count) return;  // already skipped
  }
  auto it = skipped.begin();
  while (it != skipped.end() && it->first + it->count < index) ++it;
  if (it != skipped.end() && it->first + it->count == index) {
    ++it->count;  // extends the range before it
    auto next = it + 1;
    if (next != skipped.end() && next->first == index + 1) {
      it->count += next->count;
      skipped.erase(next);
    }
  } else if (it != skipped.end() && it->first == index + 1) {
    --it->first;  // extends the range after it
    ++it->count;
  } else {
    skipped.insert(it, SkippedBatches{index, 1});
  }
}

}  // namespace gantry
