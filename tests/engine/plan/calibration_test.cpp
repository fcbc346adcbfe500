// The planner against Gantry's own engine, exactly: its parameter count, its tensor-parallel split and its
// weights/gradients/optimizer bytes against the engine's real tensor table (engine/core/gpt.h), its FLOPs
// per token against telemetry's, and its checkpoint size against a checkpoint the engine writes.
// (Peak memory against the backends' allocations, and the measured GPU figures: engine_profile_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/config.h"
#include "engine/core/gpt.h"
#include "engine/plan/planner.h"
#include "telemetry/flops.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

Config tiny() {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  EXPECT_TRUE(c.ok()) << c.error();
  return c.value();
}

// The engine's GPT-2 family as the planner describes it: learned positions, LayerNorm with bias, biases,
// GELU 4d, tied embeddings, no dropout (the planner's defaults).
PlanModel plan_model_of(const ModelConfig& mc) {
  PlanModel m;
  m.name = "engine";
  m.layers = mc.n_layer;
  m.heads = mc.n_head;
  m.hidden = mc.n_embd;
  m.vocab = mc.vocab_size;
  m.seq = mc.seq_len;
  return m;
}

// The engine's CPU backend keeps fp32 parameters (they are the master copy), fp32 gradients and fp32 AdamW
// m and v: 4 + 4 + 8 bytes per parameter.
PlanTraining engine_dtypes(const Config& c) {
  PlanTraining t;
  t.weight_bytes = 4;
  t.grad_bytes = 4;
  t.master_bytes = 0;
  t.optimizer_bytes = 8;
  t.global_batch = c.train.global_batch;
  return t;
}

uint64_t numel_where(const TensorTable& t, int layer, const std::string& suffix = "") {
  uint64_t n = 0;
  for (const TensorInfo& ti : t.tensors()) {
    const bool suffix_ok =
        suffix.empty() || (ti.name.size() >= suffix.size() &&
                           ti.name.compare(ti.name.size() - suffix.size(), suffix.size(), suffix) == 0);
    if (ti.layer == layer && suffix_ok) n += ti.numel;
  }
  return n;
}

TEST(PlanCalibration, ParameterCountsMatchTheEnginesTensorTable) {
  const Config c = tiny();
  const TensorTable t = gpt_param_table(c.model);
  const ParamCounts n = plan_param_counts(plan_model_of(c.model));
  EXPECT_EQ(n.total, t.numel());
  EXPECT_EQ(n.embedding, t.at("wte").numel);
  EXPECT_EQ(n.positions, t.at("wpe").numel);
  EXPECT_EQ(n.per_layer, numel_where(t, 0));
  EXPECT_EQ(n.per_layer, numel_where(t, c.model.n_layer - 1));
  EXPECT_EQ(n.final_norm, t.at("lnf.weight").numel + t.at("lnf.bias").numel);
  // The shipped GPT-2 configs, and llm.c's 124,475,904.
  for (const char* preset : {"gpt2-124m", "gpt2-350m"}) {
    const PlanModel m = plan_model_preset(preset).value();
    const ModelConfig mc{
        .n_layer = m.layers, .n_head = m.heads, .n_embd = m.hidden, .vocab_size = m.vocab, .seq_len = m.seq};
    EXPECT_EQ(plan_param_counts(m).total, gpt_param_table(mc).numel()) << preset;
  }
}

TEST(PlanCalibration, TensorParallelSplitMatchesTheTableUnderMegatronsRules) {
  // Column-parallel (QKV, MLP in: weights and biases) and row-parallel (the two output matrices) tensors
  // divide by tp; norms and the row-parallel output biases stay whole.
  const Config c = tiny();
  const TensorTable t = gpt_param_table(c.model);
  const uint64_t split = numel_where(t, 0, "attn.qkv.weight") + numel_where(t, 0, "attn.qkv.bias") +
                         numel_where(t, 0, "attn.proj.weight") + numel_where(t, 0, "mlp.fc.weight") +
                         numel_where(t, 0, "mlp.fc.bias") + numel_where(t, 0, "mlp.proj.weight");
  const uint64_t whole = numel_where(t, 0) - split;
  for (int tp : {1, 2, 4}) {
    EXPECT_EQ(plan_layer_params_per_rank(plan_model_of(c.model), tp), split / tp + whole) << tp;
  }
}

TEST(PlanCalibration, WeightsGradientsAndOptimizerBytesMatchTheEnginesBuffers) {
  const Config c = tiny();
  std::unique_ptr<Backend> be = backend_cpu_create(c.model, c.train.micro_batch, 1);
  const uint64_t numel = be->params().numel();  // the flat buffers' length, for all four of them
  PlanInput in;
  in.model = plan_model_of(c.model);
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 1);
  in.layout = PlanLayout{.micro_batch = c.train.micro_batch};
  in.training = engine_dtypes(c);
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->params, numel);
  EXPECT_EQ(p->params_on_gpu, numel);
  EXPECT_DOUBLE_EQ(p->memory.weights, numel * sizeof(float));        // StateBuffer::kParams
  EXPECT_DOUBLE_EQ(p->memory.gradients, numel * sizeof(float));      // kGrads
  EXPECT_DOUBLE_EQ(p->memory.optimizer, 2 * numel * sizeof(float));  // kAdamM + kAdamV
  EXPECT_EQ(p->micro_batches, c.train.global_batch / c.train.micro_batch);
}

TEST(PlanCalibration, FlopsPerTokenIsTelemetrysConvention) {
  const Config c = tiny();
  const PlanModel m = plan_model_of(c.model);
  const double engine = flops_per_token({.params = gpt_param_table(c.model).numel(),
                                         .layers = c.model.n_layer,
                                         .width = c.model.n_embd,
                                         .seq_len = c.model.seq_len});
  EXPECT_DOUBLE_EQ(plan_flops_per_token(m).gantry, engine);
  EXPECT_DOUBLE_EQ(plan_model_flops_per_token(m, FlopConvention::kGantry), engine);
}

TEST(PlanCalibration, CheckpointPayloadMatchesACheckpointTheEngineWrites) {
  // Gantry's checkpoint: a small header, then fp32 parameters, AdamW m and v (12 bytes per parameter).
  const Config c = tiny();
  std::unique_ptr<Backend> be = backend_cpu_create(c.model, c.train.micro_batch, 1);
  const fs::path root = testing_support::scratch_dir("ckpt");
  CheckpointMeta meta{.step = 1, .config = c, .code_version = "test"};
  Result<CheckpointWritten> w = checkpoint_write(root.string(), *be, meta, 1);
  ASSERT_TRUE(w.ok()) << w.error();
  const uint64_t shard = fs::file_size(fs::path(w->dir) / "shard_r00000.bin");

  PlanInput in;
  in.model = plan_model_of(c.model);
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 1);
  in.layout = PlanLayout{.micro_batch = c.train.micro_batch};
  in.training = engine_dtypes(c);
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_DOUBLE_EQ(p->checkpoint_bytes, 12.0 * be->params().numel());
  EXPECT_GE(static_cast<double>(shard), p->checkpoint_bytes);
  EXPECT_LT(static_cast<double>(shard) - p->checkpoint_bytes, 4096.0)
      << "more than a header beyond the payload";
  fs::remove_all(root);
}

}  // namespace
}  // namespace gantry
