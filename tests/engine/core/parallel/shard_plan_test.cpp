// The shard plan: units, buckets, each rank's blocks and the memory formula.
#include "engine/core/parallel/shard_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/gpt.h"

namespace gantry {
namespace {

ModelConfig model() {
  return {.n_layer = 3, .n_head = 2, .n_embd = 16, .vocab_size = 50, .seq_len = 8};
}

TEST(ShardPlan, UnitsAreEmbeddingsBlocksAndFinalNorm) {
  const TensorTable t = gpt_param_table(model());
  const ShardPlan p = shard_plan_make(t, 1, 0, 0, 1 << 20);
  ASSERT_EQ(p.units.size(), 5u);
  EXPECT_EQ(p.units[0].offset, 0u);
  EXPECT_EQ(p.units[0].count, t.at("wte").numel + t.at("wpe").numel);
  EXPECT_EQ(p.units[1].offset, t.at("h.0.ln1.weight").offset);
  EXPECT_EQ(p.units[4].offset, t.at("lnf.weight").offset);
  EXPECT_EQ(p.units[4].count, 32u);
  for (size_t u = 1; u < p.units.size(); ++u) EXPECT_EQ(p.units[u].offset, p.units[u - 1].end());
  EXPECT_EQ(p.units.back().end(), t.numel());
}

TEST(ShardPlan, BucketsAreWholeUnitsUpToTheCapWithTheEmbeddingsAlone) {
  const TensorTable t = gpt_param_table(model());
  const size_t block = gpt_param_table(model()).at("h.1.ln1.weight").offset - t.at("h.0.ln1.weight").offset;
  // A cap of two blocks: [final + block 2 + ...] fills from the top.
  const ShardPlan p = shard_plan_make(t, 2, 0, 1, (2 * block + 32) * sizeof(float));
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_EQ(p.buckets[0], p.units[0]);                // embeddings alone
  EXPECT_EQ(p.buckets[1], p.units[1]);                // block 0
  EXPECT_EQ(p.buckets[2].offset, p.units[2].offset);  // blocks 1, 2 and the final norm
  EXPECT_EQ(p.buckets[2].end(), t.numel());
  EXPECT_EQ(p.unit_bucket, (std::vector<int>{0, 1, 2, 2, 2}));
  // ZeRO 3 gathers unit by unit: every unit is its own bucket.
  const ShardPlan z3 = shard_plan_make(t, 2, 0, 3, 1 << 30);
  EXPECT_EQ(z3.buckets, z3.units);
}

// An interleaved GPU stage's chunks each complete their own buckets: a bucket start splits what the cap
// would group, and a unit out of range is refused naming the range.
TEST(ShardPlan, BucketStartsSplitWhatTheCapWouldGroup) {
  const TensorTable t = gpt_param_table(model());
  const ShardPlan whole = shard_plan_make(t, 2, 0, 2, 1 << 30);
  EXPECT_EQ(whole.unit_bucket, (std::vector<int>{0, 1, 1, 1, 1}));
  const ShardPlan split = shard_plan_make(t, 2, 0, 2, 1 << 30, {2});
  EXPECT_EQ(split.unit_bucket, (std::vector<int>{0, 1, 2, 2, 2}));  // unit 2 begins one: unit 1 alone
  EXPECT_EQ(split.buckets[1], split.units[1]);
  EXPECT_EQ(split.buckets[2].offset, split.units[2].offset);
  EXPECT_EQ(split.buckets[2].end(), t.numel());
  EXPECT_EQ(shard_plan_make(t, 2, 0, 2, 1 << 30, {2, 3}).unit_bucket, (std::vector<int>{0, 1, 2, 3, 3}));
  try {
    (void)shard_plan_make(t, 2, 0, 2, 1 << 30, {5});
    ADD_FAILURE() << "unit 5 of 5 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("bucket start unit 5 (allowed 1 to 4)"), std::string::npos)
        << e.what();
  }
}

TEST(ShardPlan, RanksOwnDisjointBlocksThatCoverEveryElement) {
  const TensorTable t = gpt_param_table(model());
  for (int dp : {1, 2, 3, 4}) {
    for (int zero : {1, 2, 3}) {
      std::vector<int> owner(t.numel(), -1);
      size_t total = 0;
      for (int r = 0; r < dp; ++r) {
        const ShardPlan p = shard_plan_make(t, dp, r, zero, 4096);
        size_t seg_total = 0;
        for (const ShardSegment& s : p.segments) {
          seg_total += s.count;
          const TensorInfo& ti = t[s.tensor];
          EXPECT_GE(s.offset, ti.offset);
          EXPECT_LE(s.offset + s.count, ti.offset + ti.numel) << "a segment crosses a tensor boundary";
          EXPECT_EQ(s.decay, ti.decay);
        }
        EXPECT_EQ(seg_total, p.shard_numel);
        for (size_t b = 0; b < p.owned.size(); ++b) {
          const CommBlock blk = comm_block(p.buckets[b].count, dp, r);
          EXPECT_EQ(p.owned[b].offset, p.buckets[b].offset + blk.offset);
          EXPECT_EQ(p.owned[b].count, blk.count);
          for (size_t i = p.owned[b].offset; i < p.owned[b].end(); ++i) {
            EXPECT_EQ(owner[i], -1) << "element " << i << " owned twice";
            owner[i] = r;
          }
        }
        total += p.shard_numel;
      }
      EXPECT_EQ(total, t.numel()) << "dp " << dp << " zero " << zero;
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
    }
  }
}

// Sequence parallelism's runs (the LayerNorms and the row-parallel biases, every tensor a tp rank holds
// whole but wpe): at ZeRO 0 two a block and one before (block 0's first norm; the last block's MLP
// projection bias runs on into the final norm), covering exactly those tensors; at ZeRO 1-3 each dp rank's
// runs are its owned parts of them (global offsets at ZeRO 1, shard offsets at 2-3), which together cover
// every flagged element once.
TEST(ShardPlan, GradientRunsAreTheOwnedPartsOfTheFlaggedTensors) {
  const TensorTable t = gpt_param_table(model());
  std::vector<bool> flagged;
  size_t flagged_numel = 0;
  for (const TensorInfo& ti : t.tensors()) {
    const bool whole = ti.name.find("ln") != std::string::npos || ti.name.ends_with("attn.proj.bias") ||
                       ti.name.ends_with("mlp.proj.bias");
    flagged.push_back(whole);
    if (whole) flagged_numel += ti.numel;
  }
  ASSERT_EQ(flagged_numel, static_cast<size_t>(3 * 6 * 16 + 2 * 16)) << "6C a block, 2C the final norm";
  const std::vector<FlatRange> all = shard_plan_make(t, 1, 0, 0, 4096).gradient_runs(flagged);
  EXPECT_EQ(all.size(), 2u * 3 + 1);
  for (int dp : {1, 2, 3, 4}) {
    for (int zero : {0, 1, 2, 3}) {
      std::vector<int> seen(t.numel(), 0);
      for (int r = 0; r < dp; ++r) {
        const ShardPlan p = shard_plan_make(t, dp, r, zero, 4096);
        for (const FlatRange& run : p.gradient_runs(flagged)) {
          for (size_t i = run.offset; i < run.end(); ++i) {
            // Back to global coordinates: the shard offset's owned block at ZeRO 2-3.
            size_t global = i;
            if (zero >= 2) {
              bool found = false;
              for (size_t b = 0; b < p.owned.size() && !found; ++b) {
                if (i >= p.owned_shard_offset[b] && i < p.owned_shard_offset[b] + p.owned[b].count) {
                  global = p.owned[b].offset + (i - p.owned_shard_offset[b]);
                  found = true;
                }
              }
              ASSERT_TRUE(found) << "shard offset " << i << " outside the rank's owned blocks";
            }
            ASSERT_LT(global, t.numel());
            ++seen[global];
          }
        }
      }
      for (size_t k = 0; k < t.size(); ++k) {
        for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; ++i) {
          // ZeRO 0: every replica sums all of them; ZeRO 1-3: each element on its one owner.
          ASSERT_EQ(seen[i], flagged[k] ? (zero == 0 ? dp : 1) : 0)
              << t[k].name << " element " << i << ", dp " << dp << " zero " << zero;
        }
      }
    }
  }
}

TEST(ShardPlan, ZeroStageZeroOwnsEverythingInFlatOrder) {
  const TensorTable t = gpt_param_table(model());
  const ShardPlan p = shard_plan_make(t, 4, 3, 0, 4096);
  EXPECT_EQ(p.shard_numel, t.numel());
  for (const ShardSegment& s : p.segments) EXPECT_EQ(s.offset, s.shard_offset);
}

// A ZeRO 0 checkpoint is written by every replica, 1/dp each: the ranks' ranges are disjoint, cover every
// element once, start on 64-float boundaries and differ in size by less than two 64-float cuts.
TEST(ShardPlan, ZeroStageZeroWritesAreSpreadEvenlyOverTheReplicas) {
  const TensorTable t = gpt_param_table(model());
  for (int dp : {1, 2, 3, 4, 7}) {
    std::vector<FlatRange> all;
    for (int r = 0; r < dp; ++r) {
      const std::vector<FlatRange> w = shard_plan_make(t, dp, r, 0, 4096).replica_written_ranges();
      ASSERT_EQ(w.size(), 1u) << "dp " << dp << " rank " << r;
      EXPECT_EQ(w[0].offset % 64, 0u);
      all.push_back(w[0]);
    }
    size_t at = 0, least = t.numel(), most = 0;
    for (const FlatRange& r : all) {
      EXPECT_EQ(r.offset, at) << "dp " << dp << ": a gap or an overlap";
      at = r.end();
      least = std::min(least, r.count);
      most = std::max(most, r.count);
    }
    EXPECT_EQ(at, t.numel()) << "dp " << dp;
    EXPECT_LT(most - least, 128u) << "dp " << dp;
  }
}

TEST(ShardPlan, MemoryFormulaPerStage) {
  const TensorTable t = gpt_param_table(model());
  const size_t P = t.numel();
  const ShardPlan p0 = shard_plan_make(t, 4, 1, 0, 4096);
  EXPECT_EQ(shard_memory(p0).params, P);
  EXPECT_EQ(shard_memory(p0).grads, P);
  EXPECT_EQ(shard_memory(p0).optimizer, 2 * P);
  const ShardPlan p1 = shard_plan_make(t, 4, 1, 1, 4096);
  EXPECT_EQ(shard_memory(p1).grads, P);
  EXPECT_EQ(shard_memory(p1).optimizer, 2 * p1.shard_numel);
  const ShardPlan p2 = shard_plan_make(t, 4, 1, 2, 4096);
  EXPECT_EQ(shard_memory(p2).params, P);
  EXPECT_EQ(shard_memory(p2).grads,
            p2.shard_numel + p2.units[0].count + 2 * p2.largest_nonembedding_bucket());
  const ShardPlan p3 = shard_plan_make(t, 4, 1, 3, 4096);
  EXPECT_EQ(shard_memory(p3).params,
            p3.shard_numel + p3.units[0].count + p3.units.back().count + 2 * p3.largest_block_unit());
  // The shard is about P / dp: blocks differ by at most one element per bucket.
  EXPECT_LE(p3.shard_numel, P / 4 + p3.buckets.size());
  EXPECT_NE(shard_memory_text(p3).find("zero 3 over dp 4"), std::string::npos);
}

}  // namespace
}  // namespace gantry
