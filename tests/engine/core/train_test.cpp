// The train loop end to end on the CPU backend: learning, determinism, exact resume.
#include "engine/core/train.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/core/checkpoint.h"
#include "engine/core/corpus.h"
#include "engine/core/token_shard.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using testing_support::fresh_dir;
using testing_support::small_config;

struct Recorder : TrainObserver {
  std::vector<double> losses, val_losses;
  std::vector<int64_t> steps, checkpoints;
  void on_step(const StepReport& r) override {
    steps.push_back(r.step);
    losses.push_back(r.loss);
    if (r.val_loss) val_losses.push_back(*r.val_loss);
  }
  void on_checkpoint(const CheckpointReport& c) override { checkpoints.push_back(c.step); }
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(Train, TinyConfigLearnsTheSyntheticCorpus) {
  // The corpus is a Markov chain whose entropy is ln(branching) nats per token: no model can beat it, and
  // a model that learned nothing stays at ln(vocab). The tiny config must get within 0.25 nats of the
  // entropy in its 150 steps.
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR) + "/assets/configs/tiny.toml");
  ASSERT_TRUE(c.ok()) << c.error();
  const double entropy = std::log(static_cast<double>(c->data.synthetic_branching));
  Recorder rec;
  Result<TrainSummary> s = train_run(c.value(), {.out_dir = fresh_dir("learn")}, &rec);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(rec.losses.size(), 150u);
  EXPECT_NEAR(rec.losses.front(), std::log(256.0), 0.1);
  EXPECT_LT(rec.losses.back(), entropy + 0.25);
  ASSERT_TRUE(s->last_val_loss.has_value());
  EXPECT_LT(*s->last_val_loss, entropy + 0.25);
  EXPECT_GT(*s->last_val_loss, entropy - 0.05) << "below the entropy: the val split leaks or the loss is wrong";
}

TEST(Train, SameConfigAndSeedGiveBitIdenticalRuns) {
  Config c = small_config();
  Recorder a, b;
  Result<TrainSummary> sa = train_run(c, {.out_dir = fresh_dir("det_a"), .max_steps = 12}, &a);
  Result<TrainSummary> sb = train_run(c, {.out_dir = fresh_dir("det_b"), .max_steps = 12}, &b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(a.losses, b.losses);  // bit for bit
  EXPECT_EQ(sa->params_xxh64, sb->params_xxh64);
  c.train.seed += 1;
  Recorder other;
  ASSERT_TRUE(train_run(c, {.out_dir = fresh_dir("det_c"), .max_steps = 12}, &other).ok());
  EXPECT_NE(other.losses, a.losses) << "the seed must matter";
}

TEST(Train, ResumeIsBitExact) {
  // 2k steps straight vs k steps, stop, resume from the checkpoint, continue to 2k.
  const int k = 10;
  Config c = small_config();
  c.train.max_steps = 2 * k;
  Recorder straight, first, second;
  const std::string dir_s = fresh_dir("resume_straight"), dir_r = fresh_dir("resume_split");
  Result<TrainSummary> s = train_run(c, {.out_dir = dir_s}, &straight);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_TRUE(train_run(c, {.out_dir = dir_r, .max_steps = k}, &first).ok());
  Result<TrainSummary> r = train_run(c, {.out_dir = dir_r, .resume = "latest"}, &second);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->first_step, k);

  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, straight.losses);
  EXPECT_EQ(second.val_losses, std::vector<double>(straight.val_losses.end() - 2, straight.val_losses.end()));
  EXPECT_EQ(r->params_xxh64, s->params_xxh64);
  // Parameters and AdamW state: the final checkpoints' shards are the same bytes.
  EXPECT_EQ(file_bytes(s->checkpoint_dir + "/shard_r00000.bin"), file_bytes(r->checkpoint_dir + "/shard_r00000.bin"));
}

TEST(Train, GradientAccumulationKeepsTheGlobalBatch) {
  // Micro-batch 4 × 2 and micro-batch 8 × 1 compute the same step, up to summation order.
  Config c = small_config();
  Recorder split, whole;
  ASSERT_TRUE(train_run(c, {.out_dir = fresh_dir("accum_a"), .max_steps = 5}, &split).ok());
  c.train.micro_batch = 8;
  ASSERT_TRUE(train_run(c, {.out_dir = fresh_dir("accum_b"), .max_steps = 5}, &whole).ok());
  ASSERT_EQ(split.losses.size(), whole.losses.size());
  for (size_t i = 0; i < split.losses.size(); ++i) EXPECT_NEAR(split.losses[i], whole.losses[i], 1e-5 * whole.losses[i]);
}

TEST(Train, CheckpointsEveryNAndKeepsLastK) {
  Config c = small_config();
  c.train.checkpoint_every = 4;
  c.train.keep_checkpoints = 2;
  c.train.max_steps = 14;
  Recorder rec;
  const std::string out = fresh_dir("keep");
  ASSERT_TRUE(train_run(c, {.out_dir = out}, &rec).ok());
  EXPECT_EQ(rec.checkpoints, (std::vector<int64_t>{4, 8, 12, 14}));
  std::vector<std::string> kept = checkpoint_list(out + "/checkpoints");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_THAT(kept[0], ::testing::EndsWith("step_00000012"));
  EXPECT_THAT(kept[1], ::testing::EndsWith("step_00000014"));
}

TEST(Train, StopFlagEndsAtAStepBoundaryWithACheckpoint) {
  Config c = small_config();
  std::atomic<bool> stop{true};
  Recorder rec;
  Result<TrainSummary> s = train_run(c, {.out_dir = fresh_dir("stop"), .stop = &stop}, &rec);
  ASSERT_TRUE(s.ok()) << s.error();
  EXPECT_TRUE(s->stopped_early);
  EXPECT_TRUE(rec.losses.empty());
  EXPECT_FALSE(s->checkpoint_dir.empty());
}

TEST(Train, DataBeyondTheVocabularyIsRefused) {
  Config c = small_config();
  const std::string dir = fresh_dir("vocab_data");
  std::vector<uint32_t> tokens(2000, 3);
  tokens[500] = 64;  // vocab_size is 64: token ids must be < 64
  ASSERT_TRUE(token_shard_write(dir + "/train_000000.bin", tokens, 1).ok());
  ASSERT_TRUE(token_shard_write(dir + "/val_000000.bin", std::vector<uint32_t>(100, 1), 1).ok());
  c.data.kind = "shards";
  c.data.dir = dir;
  Result<TrainSummary> s = train_run(c, {.out_dir = fresh_dir("vocab_out")}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), ::testing::HasSubstr("token 64"));
  EXPECT_THAT(s.error(), ::testing::HasSubstr("model.vocab_size = 64"));
}

TEST(Train, ResumeLatestWithoutCheckpointsNamesTheFolder) {
  const std::string out = fresh_dir("no_ckpt");
  Result<TrainSummary> s = train_run(small_config(), {.out_dir = out, .resume = "latest"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), ::testing::HasSubstr(out + "/checkpoints"));
}

}  // namespace
}  // namespace gantry
