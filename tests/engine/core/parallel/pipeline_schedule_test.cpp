// The pipeline's arithmetic: stages balanced by cost, the schedules' action orders and what they hold, the
// bubble formula, and the layouts refused with the numbers named.
#include "engine/core/parallel/pipeline_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "engine/core/gpt.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

Config tiny(int layers) {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR) + "/assets/configs/tiny.toml");
  EXPECT_TRUE(c.ok()) << c.error();
  Config cfg = c.value();
  cfg.model.n_layer = layers;
  cfg.train.checkpoint_every = 0;
  return cfg;
}

ParallelDims dims(int world, int dp, int tp, int pp, int zero = 0) {
  Result<ParallelDims> d =
      ParallelDims::make({.world = world, .rank = 0, .dp = dp, .tp = tp, .pp = pp, .zero = zero});
  EXPECT_TRUE(d.ok()) << d.error();
  return d.value();
}

TEST(PipelinePartition, EqualBlocksSplitEvenlyWhenTheHeadIsCheap) {
  const Config c = tiny(4);
  const PipelinePartition p = pipeline_partition(c.model, 2);
  EXPECT_EQ(p.layers, (std::vector<int>{2, 2}));
  EXPECT_EQ(p.first_layer, (std::vector<int>{0, 2}));
  const PipelinePartition q = pipeline_partition(c.model, 4);
  EXPECT_EQ(q.layers, (std::vector<int>{1, 1, 1, 1}));
}

TEST(PipelinePartition, ACostlyClassifierTakesLayersOffTheLastStage) {
  // vocab 65536 at d 64: the classifier's forward and input gradient (2 x 2VC per token) outweigh several
  // blocks, so the last stage gets fewer of them; the first stage's share of the head (VC) counts too.
  Config c = tiny(8);
  c.model.vocab_size = 65536;
  const PipelinePartition p = pipeline_partition(c.model, 2);
  EXPECT_EQ(p.layers[0] + p.layers[1], 8);
  EXPECT_GT(p.layers[0], p.layers[1]) << p.describe();
  // Optimal: no other split has a smaller costliest stage.
  const double block = pipeline_block_cost(c.model), vc = 2.0 * c.model.vocab_size * c.model.n_embd;
  const double best = std::max(p.cost[0], p.cost[1]);
  for (int k = 1; k < 8; ++k) EXPECT_LE(best, std::max(k * block + vc, (8 - k) * block + 2 * vc) + 1e-6);
}

TEST(PipelinePartition, StageTablesCoverTheModelOnceAndSliceByName) {
  const Config c = tiny(4);
  const TensorTable whole = gpt_param_table(c.model);
  std::vector<float> all(whole.numel());
  std::iota(all.begin(), all.end(), 0.0f);
  const PipelinePartition p = pipeline_partition(c.model, 3);
  std::set<std::string> seen;
  size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    const TensorTable t = pipeline_stage_table(c.model, p, s);
    std::vector<float> mine(t.numel());
    pipeline_slice(whole, all.data(), t, mine.data());
    for (const TensorInfo& x : t.tensors()) {
      EXPECT_TRUE(seen.insert(x.name).second) << x.name << " on two stages";
      EXPECT_EQ(mine[x.offset], all[whole.at(x.name).offset]) << x.name;
      EXPECT_EQ(mine[x.offset + x.numel - 1], all[whole.at(x.name).offset + x.numel - 1]) << x.name;
    }
    total += t.numel();
  }
  EXPECT_EQ(total, whole.numel());
  EXPECT_NE(pipeline_stage_table(c.model, p, 0).find("wte"), nullptr);  // owned by the first stage
  EXPECT_NE(pipeline_stage_table(c.model, p, 2).find("lnf.weight"), nullptr);
}

// Every micro-batch's forward comes before its backward, backwards run in micro-batch order, and the
// activations held never exceed the schedule's bound: m for GPipe, pp - stage for 1F1B.
TEST(PipelineActions, OrdersAndActivationsHeld) {
  for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    for (int pp : {2, 4}) {
      for (int m : {4, 8}) {
        for (int stage = 0; stage < pp; ++stage) {
          const std::vector<PipelineAction> a = pipeline_actions(s, pp, stage, m);
          ASSERT_EQ(a.size(), static_cast<size_t>(2 * m));
          std::vector<int> forward_at(m, -1);
          int next_backward = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            if (a[i].op == PipelineOp::kForward) {
              forward_at[a[i].micro] = static_cast<int>(i);
            } else {
              EXPECT_EQ(a[i].micro, next_backward++);
              EXPECT_GE(forward_at[a[i].micro], 0);
            }
          }
          const int bound = s == PipelineSchedule::kGpipe ? m : std::min(m, pp - stage);
          EXPECT_EQ(pipeline_in_flight(a), bound)
              << pipeline_schedule_name(s) << " pp " << pp << " stage " << stage << " m " << m;
        }
      }
    }
  }
}

TEST(PipelineBubble, Formula) {
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 1, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 2, 8), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(1, 1, 8), 0.0);
}

TEST(PipelineCheck, RefusesBadLayoutsNamingTheNumbers) {
  Config c = tiny(2);
  c.train.micro_batch = 2;  // 8 micro-batches at dp 1
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 8).ok());
  EXPECT_THAT(pipeline_check(c, dims(4, 1, 1, 4), 8).message(),
              HasSubstr("pp 4 x vp 1 = 4 stages but model.n_layer is 2"));
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 8, 2).message(),
              HasSubstr("vp 2: interleaved 1F1B (virtual stages) is not implemented"));
  c.train.micro_batch = 8;
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 1).message(),
              HasSubstr("pp 2 with train.pp_schedule = \"1f1b\" needs at least 2 micro-batches per step"));
  c.train.pp_schedule = "gpipe";
  EXPECT_TRUE(pipeline_check(c, dims(2, 1, 1, 2), 1).ok());  // GPipe runs (all bubble) with one
  EXPECT_THAT(pipeline_check(c, dims(4, 2, 1, 2, 2), 2).message(), HasSubstr("pp 2 with zero 2"));
  EXPECT_TRUE(pipeline_check(c, dims(4, 1, 2, 2), 2).ok());  // tp x pp composes (stages run tensor-parallel)
  c.train.checkpoint_every = 10;
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 2).message(),
              HasSubstr("pp 2: checkpoints of a pipeline are not implemented yet"));
  c.train.checkpoint_every = 0;
  c.train.memory_copy_every = 5;
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 2).message(),
              HasSubstr("pp 2: in-memory copies of a pipeline are not implemented yet"));
  c.train.memory_copy_every = 0;
  c.train.backend = "cuda";
  EXPECT_THAT(pipeline_check(c, dims(2, 1, 1, 2), 2).message(), HasSubstr("pipeline parallel is CPU-only"));
  // The product that is not the world is ParallelDims' to refuse.
  Result<ParallelDims> d = ParallelDims::make({.world = 6, .rank = 0, .dp = 2, .tp = 1, .pp = 2});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error(), HasSubstr("dp 2 x tp 1 x pp 2 = 4 but the world has 6 ranks"));
}

}  // namespace
}  // namespace gantry
