// Tensor parallelism's layout checks and its split of the model (parallel/tensor_parallel.h), in one process.
#include "engine/core/parallel/tensor_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "engine/core/gpt.h"
#include "engine/core/parallel/pipeline_schedule.h"
#include "engine/core/train.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

ModelConfig tiny_model() {
  return {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 16};
}

ParallelDims dims(int world, int dp, int tp, int pp = 1) {
  return {.world = world, .rank = 0, .dp = dp, .tp = tp, .pp = pp};
}

TEST(TensorParallelCheck, AcceptsLayoutsThatSplitTheHeads) {
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(1, 1, 1), "cpu").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(2, 1, 2), "cpu").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(4, 1, 4), "cpu").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(4, 2, 2), "cpu").ok());
  // tp 1 holds on any backend.
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(2, 2, 1), "cuda").ok());
}

TEST(TensorParallelCheck, RefusesHeadsNotDivisibleByTp) {
  Status s = tensor_parallel_check(tiny_model(), dims(3, 1, 3), "cpu");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp 3 does not divide model.n_head 4"));
  EXPECT_THAT(s.message(), HasSubstr("choose a tp that divides 4"));
}

TEST(TensorParallelCheck, RefusesAnMlpWidthNotDivisibleByTp) {
  // n_head divides n_embd in any valid config, which makes 4 x n_embd a multiple of any tp that divides
  // n_head; a model built in code can still break it.
  ModelConfig m = tiny_model();
  m.n_head = 8;
  m.n_embd = 1;
  Status s = tensor_parallel_check(m, dims(8, 1, 8), "cpu");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp 8 does not divide the MLP width 4 x model.n_embd = 4"));
}

TEST(TensorParallelCheck, RefusesAVocabularyNotDivisibleByTp) {
  ModelConfig m = tiny_model();
  m.vocab_size = 257;
  Status s = tensor_parallel_check(m, dims(2, 1, 2), "cpu");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp 2 does not divide model.vocab_size 257"));
  EXPECT_THAT(s.message(), HasSubstr("pad the vocabulary to a multiple of 2 (e.g. 258)"));
  EXPECT_TRUE(tensor_parallel_check(m, dims(2, 2, 1), "cpu").ok());  // tp 1 takes any vocabulary
}

TEST(TensorParallelCheck, SequenceParallelRefusesASequenceNotDivisibleByTp) {
  ModelConfig m = tiny_model();
  m.seq_len = 18;  // tp 4 divides the heads, the MLP and the vocabulary, not 18 positions
  EXPECT_TRUE(tensor_parallel_check(m, dims(4, 1, 4), "cpu").ok());  // without sequence parallelism
  Status s = tensor_parallel_check(m, dims(4, 1, 4), "cpu", /*sequence_parallel=*/true);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp 4 with train.sequence_parallel does not divide model.seq_len 18"));
  EXPECT_THAT(s.message(), HasSubstr("a seq_len that is a multiple of 4"));
  EXPECT_TRUE(tensor_parallel_check(m, dims(2, 1, 2), "cpu", true).ok());  // 18 = 2 x 9
  EXPECT_TRUE(tensor_parallel_check(m, dims(4, 4, 1), "cpu", true).ok());  // no tp: nothing to split
}

TEST(TensorParallelCheck, LeavesPipelineToItsOwnCheckAndTakesTheCudaBackendWithPipelineAndSequenceApart) {
  // pp is pipeline_check's (parallel/pipeline_schedule.h, tested in pipeline_schedule_test).
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(2, 1, 1, 2), "cpu").ok());
  // The CUDA backend runs tensor parallel, with dp beside it, and inside pipeline stages (tp x pp x dp).
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(2, 1, 2), "cuda").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(4, 2, 2), "cuda").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(4, 1, 2, 2), "cuda").ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(8, 2, 2, 2), "cuda").ok());
  // Sequence parallelism at pp 1 (with dp beside it), not inside pipeline stages yet: the refusal names
  // what it refuses and what would run.
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(2, 1, 2), "cuda", /*sequence_parallel=*/true).ok());
  EXPECT_TRUE(tensor_parallel_check(tiny_model(), dims(4, 2, 2), "cuda", /*sequence_parallel=*/true).ok());
  Status sp_pp = tensor_parallel_check(tiny_model(), dims(4, 1, 2, 2), "cuda", /*sequence_parallel=*/true);
  ASSERT_FALSE(sp_pp.ok());
  EXPECT_THAT(sp_pp.message(),
              HasSubstr("tp 2 x pp 2 with train.sequence_parallel and train.backend = \"cuda\": the GPU runs "
                        "sequence parallelism at pp 1 only for now"));
  EXPECT_THAT(sp_pp.message(), HasSubstr("set train.sequence_parallel = false, pp 1"));
  // The split's own checks hold inside pipeline stages too.
  EXPECT_THAT(tensor_parallel_check(tiny_model(), dims(6, 1, 3, 2), "cuda").message(),
              HasSubstr("tp 3 does not divide model.n_head 4"));
  // The model's own divisibility holds on the GPU as on the CPU.
  EXPECT_THAT(tensor_parallel_check(tiny_model(), dims(3, 1, 3), "cuda").message(),
              HasSubstr("tp 3 does not divide model.n_head 4"));
  EXPECT_THAT(tensor_parallel_check(tiny_model(), dims(2, 1, 2), "tpu").message(),
              HasSubstr("tensor parallel runs on the \"cpu\" and \"cuda\" backends"));
}

TEST(TensorParallelCheck, ProductThatIsNotTheWorldIsRefusedNamingTheNumbers) {
  Result<ParallelDims> d = ParallelDims::make({.world = 4, .rank = 0, .dp = 1, .tp = 2});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error(), HasSubstr("dp 1 x tp 2 x pp 1 = 2 but the world has 4 ranks"));
}

TEST(TensorParallelCheck, TheTrainLoopRefusesABadLayoutBeforeBuildingAnything) {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  ASSERT_TRUE(c.ok()) << c.error();
  c->train.checkpoint_every = 0;
  // tp 3 of the tiny model's 4 heads: refused before any communicator is asked for.
  DistContext ctx{.dims = {.world = 3, .rank = 0, .dp = 1, .tp = 3}};
  Result<TrainSummary> s =
      train_run(c.value(), {.out_dir = testing_support::fresh_dir("tp3"), .dist = &ctx}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("tp 3 does not divide model.n_head 4"));
  // Sequence parallelism with tp 3 of 64 positions (heads fixed to split): refused the same way.
  Config sp = c.value();
  sp.model.n_head = 3;
  sp.model.n_embd = 48;
  sp.model.vocab_size = 255;
  sp.train.sequence_parallel = true;
  s = train_run(sp, {.out_dir = testing_support::fresh_dir("tp3_sp"), .dist = &ctx}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("tp 3 with train.sequence_parallel does not divide model.seq_len 64"));
  // A checkpoint cadence under tp > 1 is no longer refused (tensor_parallel_checkpoint_test.cpp): this
  // context fails only for want of its communicators.
  c->train.checkpoint_every = 5;
  DistContext tp2{.dims = {.world = 2, .rank = 0, .dp = 1, .tp = 2}};
  s = train_run(c.value(), {.out_dir = testing_support::fresh_dir("tp2_ckpt"), .dist = &tp2}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("needs its tp and world communicators"));
}

TEST(TensorParallelSplit, SharesHaveTheSplitShapes) {
  const TensorTable t = gpt_param_table(tiny_model(), 4);
  EXPECT_EQ(t.find("h.0.attn.qkv.weight")->shape, (std::vector<int64_t>{48, 64}));
  EXPECT_EQ(t.find("h.0.attn.proj.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(t.find("h.0.attn.proj.bias")->shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(t.find("h.1.mlp.fc.weight")->shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(t.find("h.1.mlp.proj.weight")->shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(t.find("wte")->shape, (std::vector<int64_t>{64, 64}));  // vocab-parallel: 256 / 4 token rows
}

TEST(TensorParallelSplit, SharesOfEveryRankRebuildTheWholeModel) {
  const ModelConfig m = tiny_model();
  const TensorTable whole = gpt_param_table(m);
  std::vector<float> full(whole.numel());
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);  // every element distinct
  for (int tp : {2, 4}) {
    const TensorTable mine = gpt_param_table(m, tp);
    std::vector<float> rebuilt(whole.numel(), -1.0f), share(mine.numel());
    for (int r = 0; r < tp; ++r) {
      tensor_parallel_slice(m, tp, r, full.data(), share.data());
      tensor_parallel_unslice(m, tp, r, share.data(), rebuilt.data());
    }
    EXPECT_EQ(rebuilt, full) << "tp " << tp;
  }
  // Rank 1 of tp 2 holds heads 2-3: Q rows 32.., K rows 64 + 32.., V rows 128 + 32...
  const TensorTable two = gpt_param_table(m, 2);
  std::vector<float> share(two.numel());
  tensor_parallel_slice(m, 2, 1, full.data(), share.data());
  const TensorInfo& wq = *whole.find("h.0.attn.qkv.weight");
  const TensorInfo& lq = *two.find("h.0.attn.qkv.weight");
  EXPECT_EQ(share[lq.offset], full[wq.offset + 32 * 64]);             // first Q row of head 2
  EXPECT_EQ(share[lq.offset + 32 * 64], full[wq.offset + 96 * 64]);   // first K row of head 2
  EXPECT_EQ(share[lq.offset + 64 * 64], full[wq.offset + 160 * 64]);  // first V row of head 2
  const TensorInfo& wp = *whole.find("h.0.attn.proj.weight");
  const TensorInfo& lp = *two.find("h.0.attn.proj.weight");
  EXPECT_EQ(share[lp.offset + 1 * 32], full[wp.offset + 1 * 64 + 32]);  // row 1, column 32 (head 2's first)
  EXPECT_TRUE(tensor_parallel_sharded("h.3.mlp.proj.weight"));
  EXPECT_FALSE(tensor_parallel_sharded("h.3.mlp.proj.bias"));
  EXPECT_TRUE(tensor_parallel_sharded("wte"));  // vocab-parallel
  EXPECT_FALSE(tensor_parallel_sharded("wpe"));
  // Rank 1 of tp 2 holds token rows 128..255 of wte.
  const TensorInfo& we = *whole.find("wte");
  const TensorInfo& le = *two.find("wte");
  EXPECT_EQ(share[le.offset], full[we.offset + 128 * 64]);
}

// tp x pp: a stage's table holds only its tensors, each the tp rank's share with its place in the whole.
TEST(TensorParallelSplit, AStageTableKeepsTheStagesTensorsWithTheirShares) {
  const ModelConfig m = tiny_model();  // 2 layers: at pp 2 stage 0 has wte, wpe and h.0; stage 1 h.1 and lnf
  const PipelinePartition part = pipeline_partition(m, 2);
  const TensorTable whole = tensor_parallel_table(m, 2, 1);
  for (int stage = 0; stage < 2; ++stage) {
    const TensorTable plain = pipeline_stage_table(m, part, stage);
    const TensorTable t = tensor_parallel_stage_table(m, 2, 1, plain);
    ASSERT_EQ(t.size(), plain.size());
    size_t numel = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const TensorInfo& w = whole.at(t[i].name);
      EXPECT_EQ(t[i].name, plain[i].name);
      EXPECT_EQ(t[i].shape, w.shape) << t[i].name;  // the tp share's shape
      EXPECT_EQ(t[i].share.offset, w.share.offset) << t[i].name;
      EXPECT_EQ(t[i].share.width, w.share.width) << t[i].name;
      EXPECT_EQ(t[i].share.replicas, w.share.replicas) << t[i].name;
      numel += w.numel;
    }
    EXPECT_EQ(t.numel(), numel);
  }
  EXPECT_NE(tensor_parallel_stage_table(m, 2, 1, pipeline_stage_table(m, part, 0)).find("wte"), nullptr);
  EXPECT_EQ(tensor_parallel_stage_table(m, 2, 1, pipeline_stage_table(m, part, 1)).find("wte"), nullptr);
  EXPECT_EQ(tensor_parallel_stage_table(m, 2, 1, pipeline_stage_table(m, part, 0)).at("wte").shape,
            (std::vector<int64_t>{128, 64}));  // vocab-parallel: half of the 256 token rows
}

// What a checkpoint writes: each tensor of a tp rank's table says where its share lies in the whole one.
TEST(TensorParallelSplit, TheTableRecordsEachSharesPlaceInTheWholeTensor) {
  const ModelConfig m = tiny_model();  // C 64, 4 heads: at tp 4 one head (16 rows of each of Q, K, V)
  const TensorTable t = tensor_parallel_table(m, 4, 1);
  const TensorInfo& qkv = *t.find("h.0.attn.qkv.weight");
  EXPECT_EQ(qkv.whole_shape(), (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(qkv.share.offset, 16u * 64);  // Q rows 16..31, then K and V 64 rows further each
  EXPECT_EQ(qkv.share.width, 16u * 64);
  EXPECT_EQ(qkv.share.stride, 64u * 64);
  const TensorInfo& proj = *t.find("h.1.mlp.proj.weight");  // (64, 256) split by columns
  EXPECT_EQ(proj.whole_shape(), (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(proj.share.offset, 64u);
  EXPECT_EQ(proj.share.width, 64u);
  EXPECT_EQ(proj.share.stride, 256u);
  const TensorInfo& fc_b = *t.find("h.1.mlp.fc.bias");  // (256) split by rows
  EXPECT_EQ(fc_b.share.offset, 64u);
  EXPECT_EQ(fc_b.share.width, 64u);
  // Whole on every tp rank: one of 4 replicas, each writing a quarter into a checkpoint.
  const TensorInfo& ln = *t.find("h.0.ln1.weight");
  EXPECT_FALSE(ln.share.split());
  EXPECT_EQ(ln.share.replicas, 4);
  EXPECT_EQ(ln.share.replica, 1);
  // tp 1: the whole model, nothing shared.
  const TensorTable one = tensor_parallel_table(m, 1, 0);
  for (const TensorInfo& w : one.tensors()) {
    EXPECT_FALSE(w.share.split()) << w.name;
    EXPECT_EQ(w.share.replicas, 1) << w.name;
  }
}

}  // namespace
}  // namespace gantry
