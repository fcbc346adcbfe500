#include "engine/core/sampler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace gantry {
namespace {

std::vector<uint64_t> permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = sampler_permute(i, n, seed, epoch);
  return out;
}

TEST(Sampler, PermuteIsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 8ull, 1000ull, 1024ull, 4097ull}) {
    for (uint64_t seed : {0ull, 1ull, 42ull, 0xFFFFFFFFFFFFFFFFull}) {
      for (uint64_t epoch : {0ull, 1ull, 17ull}) {
        std::vector<uint64_t> p = permutation(n, seed, epoch);
        std::vector<bool> seen(n, false);
        for (uint64_t v : p) {
          ASSERT_LT(v, n) << "n=" << n << " seed=" << seed << " epoch=" << epoch;
          ASSERT_FALSE(seen[v]) << "n=" << n << " seed=" << seed << " epoch=" << epoch << " repeats " << v;
          seen[v] = true;
        }
      }
    }
  }
}

TEST(Sampler, PermuteHandlesHugeDomains) {
  // Odd and even bit counts up to 64 bits; a handful of positions must map into range and stay distinct.
  for (uint64_t n : {(1ull << 33) + 1, (1ull << 63) + 12345, ~0ull}) {
    std::set<uint64_t> out;
    for (uint64_t i = 0; i < 64; ++i) {
      uint64_t v = sampler_permute(i, n, 9, 2);
      EXPECT_LT(v, n);
      out.insert(v);
    }
    EXPECT_EQ(out.size(), 64u);
  }
}

TEST(Sampler, PermuteIsDeterministic) {
  EXPECT_EQ(permutation(1000, 7, 3), permutation(1000, 7, 3));
  EXPECT_EQ(sampler_permute(123, 4097, 5, 6), sampler_permute(123, 4097, 5, 6));
}

TEST(Sampler, EpochsAndSeedsGiveDifferentOrders) {
  const std::vector<uint64_t> base = permutation(1000, 7, 0);
  EXPECT_NE(base, permutation(1000, 7, 1));
  EXPECT_NE(base, permutation(1000, 8, 0));
  std::vector<uint64_t> identity(1000);
  for (uint64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(base, identity);
  // A shuffle, not a rotation: few fixed points (about one expected) and the first window of each of
  // 50 epochs is not always the same.
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += base[i] == i;
  EXPECT_LT(fixed, 10);
  std::set<uint64_t> firsts;
  for (uint64_t e = 0; e < 50; ++e) firsts.insert(sampler_permute(0, 1000, 7, e));
  EXPECT_GT(firsts.size(), 40u);
}

TEST(Sampler, EveryEpochVisitsEveryWindowOnce) {
  const uint64_t w = 37;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<uint64_t> seen;
    for (uint64_t g = epoch * w; g < (epoch + 1) * w; ++g) {
      EXPECT_EQ(sampler_epoch(g, w), epoch);
      seen.insert(sampler_window(11, g, w));
    }
    EXPECT_EQ(seen.size(), w);
    EXPECT_EQ(*seen.rbegin(), w - 1);
  }
  EXPECT_EQ(sampler_window(11, 5, w), sampler_permute(5, w, 11, 0));
  EXPECT_EQ(sampler_window(11, w + 5, w), sampler_permute(5, w, 11, 1));
  EXPECT_EQ(sampler_window(11, 5, 0), 0u);
  EXPECT_EQ(sampler_epoch(5, 0), 0u);
}

TEST(Sampler, MicroBatchesCoverTheGlobalBatchExactly) {
  const int global_batch = 16;
  for (int dp : {1, 2, 4}) {
    const int per_rank = global_batch / dp;
    for (int micro : {1, 2, 3, 4, per_rank}) {
      if (micro > per_rank) continue;
      const int micro_count = (per_rank + micro - 1) / micro;
      for (uint64_t step : {0ull, 1ull, 9ull}) {
        std::vector<int> hits(global_batch, 0);
        for (int r = 0; r < dp; ++r) {
          uint64_t next = step * global_batch + static_cast<uint64_t>(r) * per_rank;
          for (int m = 0; m < micro_count; ++m) {
            SampleRange range = sampler_micro_batch(step, global_batch, dp, r, micro, m);
            EXPECT_EQ(range.first, next) << "dp=" << dp << " B=" << micro << " rank " << r << " micro " << m;
            EXPECT_GT(range.count, 0u);
            EXPECT_LE(range.count, static_cast<uint64_t>(micro));
            for (uint64_t k = 0; k < range.count; ++k) {
              uint64_t g = range.first + k;
              ASSERT_GE(g, step * global_batch);
              ASSERT_LT(g, (step + 1) * global_batch);
              ++hits[g - step * global_batch];
            }
            next += range.count;
          }
          // Past the rank's share: nothing.
          EXPECT_EQ(sampler_micro_batch(step, global_batch, dp, r, micro, micro_count).count, 0u);
        }
        for (int i = 0; i < global_batch; ++i)
          EXPECT_EQ(hits[i], 1) << "dp=" << dp << " B=" << micro << " i=" << i;
      }
    }
  }
}

TEST(Sampler, MicroBatchRejectsBadArguments) {
  EXPECT_EQ(sampler_micro_batch(0, 8, 2, 2, 2, 0).count, 0u);   // rank out of range
  EXPECT_EQ(sampler_micro_batch(0, 8, 0, 0, 2, 0).count, 0u);   // dp 0
  EXPECT_EQ(sampler_micro_batch(0, 8, 2, 0, 0, 0).count, 0u);   // micro batch 0
  EXPECT_EQ(sampler_micro_batch(0, 8, 2, 0, 2, -1).count, 0u);  // negative micro index
}

// The windows a run reads, keyed by global sample index, for steps [from, to) under one layout.
std::map<uint64_t, uint64_t> run_steps(SamplerCursor cursor, uint64_t to, int global_batch, int dp, int micro,
                                       uint64_t num_windows) {
  std::map<uint64_t, uint64_t> read;
  for (; cursor.step < to; ++cursor.step) {
    for (int r = 0; r < dp; ++r) {
      for (int m = 0;; ++m) {
        SampleRange range = sampler_micro_batch(cursor.step, global_batch, dp, r, micro, m);
        if (range.count == 0) break;
        for (uint64_t k = 0; k < range.count; ++k) {
          read[range.first + k] = sampler_window(cursor.seed, range.first + k, num_windows);
        }
      }
    }
  }
  return read;
}

TEST(Sampler, ResumeFromCursorMatchesStraightRun) {
  const uint64_t seed = 1234, windows = 50;  // 8 × 20 = 160 samples: crosses three epoch boundaries
  std::map<uint64_t, uint64_t> straight = run_steps({seed, 0}, 20, 8, 2, 2, windows);
  ASSERT_EQ(straight.size(), 160u);

  std::map<uint64_t, uint64_t> resumed = run_steps({seed, 0}, 7, 8, 2, 2, windows);
  SamplerCursor saved{seed, 7};
  // Resumed with a different data-parallel layout and micro-batch size.
  std::map<uint64_t, uint64_t> rest = run_steps(saved, 20, 8, 4, 1, windows);
  resumed.insert(rest.begin(), rest.end());
  EXPECT_EQ(resumed, straight);
}

// The rollback's data cursor: skipped ranges are passed over, in data order, and merge as they grow.
TEST(Sampler, SkippedBatchesArePassedOver) {
  std::vector<SkippedBatches> skipped;
  EXPECT_EQ(sampler_batch(5, skipped), 5u);
  sampler_skip_batch(skipped, 6);
  sampler_skip_batch(skipped, 7);
  EXPECT_EQ(skipped, (std::vector<SkippedBatches>{{6, 2}}));
  EXPECT_EQ(sampler_batch(5, skipped), 5u);
  EXPECT_EQ(sampler_batch(6, skipped), 8u);
  EXPECT_EQ(sampler_batch(7, skipped), 9u);
  sampler_skip_batch(skipped, 10);  // a second rollback, later in the data
  EXPECT_EQ(skipped, (std::vector<SkippedBatches>{{6, 2}, {10, 1}}));
  EXPECT_EQ(sampler_batch(7, skipped), 9u);
  EXPECT_EQ(sampler_batch(8, skipped), 11u);
  sampler_skip_batch(skipped, 9);  // extends the range after it
  EXPECT_EQ(skipped, (std::vector<SkippedBatches>{{6, 2}, {9, 2}}));
  sampler_skip_batch(skipped, 8);  // joins both neighbours
  EXPECT_EQ(skipped, (std::vector<SkippedBatches>{{6, 5}}));
  sampler_skip_batch(skipped, 5);
  sampler_skip_batch(skipped, 7);  // already skipped: no change
  EXPECT_EQ(skipped, (std::vector<SkippedBatches>{{5, 6}}));
  EXPECT_EQ(sampler_batch(5, skipped), 11u);
}

}  // namespace
}  // namespace gantry
