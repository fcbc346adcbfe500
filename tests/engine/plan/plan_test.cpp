// The planner's formulas on hand-computed cases: parameter counts, FLOPs, activation memory (Korthikanti
// et al. 2022), in-flight micro-batches and bubbles, nccl-tests' bus factors, Young/Daly, the buckets of a
// plan, its validation messages and the layout search.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/plan/cluster.h"
#include "engine/plan/memory.h"
#include "engine/plan/model.h"
#include "engine/plan/planner.h"
#include "engine/plan/reliability.h"
#include "engine/plan/search.h"

namespace gantry {
namespace {

PlanModel preset(const char* name) {
  Result<PlanModel> m = plan_model_preset(name);
  EXPECT_TRUE(m.ok()) << m.error();
  return m.value();
}

// A GPT-3-shaped model (GELU 4h, MHA, dropout): Korthikanti et al.'s formulas hold exactly.
PlanModel gpt3_shaped(int layers, int hidden, int heads) {
  PlanModel m = preset("gpt3-175b");
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  return m;
}

TEST(PlanModel, Gpt2SmallHasLlmCsParameterCount) {
  const ParamCounts n = plan_param_counts(preset("gpt2-124m"));
  EXPECT_EQ(n.total, 124475904u);
  EXPECT_EQ(n.embedding, 50304u * 768u);
  EXPECT_EQ(n.positions, 1024u * 768u);
  EXPECT_EQ(n.per_layer, 12u * 768u * 768u + 13u * 768u);  // 12d² weights, 13d biases and norms
  EXPECT_EQ(n.head, 0u);                                   // tied
}

TEST(PlanModel, Gpt3MatchesNarayananEquation2) {
  // Narayanan et al. 2021 eq. (2): P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)); it leaves out the final
  // LayerNorm (2h), which the exact count has.
  const PlanModel m = preset("gpt3-175b");
  const double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq;
  const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  EXPECT_NEAR(static_cast<double>(plan_param_counts(m).total), eq2 + 2 * h, 1.0);
  EXPECT_NEAR(plan_param_counts(m).total / 1e9, 174.6, 0.05);  // Narayanan et al. 2021 Table 2: 174.6B
}

TEST(PlanModel, LlamaCountsGroupedQueryAttentionSwiGluAndTheUntiedHead) {
  // Llama 3 8B by hand: 2 x V x d (embedding and head) + 32 x (2d² + 2·d·1024 + 3·d·14336 + 2d) + d.
  const uint64_t d = 4096, V = 128256;
  const uint64_t per_layer = 2 * d * d + 2 * d * 1024 + 3 * d * 14336 + 2 * d;
  const ParamCounts n = plan_param_counts(preset("llama3-8b"));
  EXPECT_EQ(n.per_layer, per_layer);
  EXPECT_EQ(n.total, 2 * V * d + 32 * per_layer + d);
  EXPECT_EQ(n.total, 8030261248u);
  EXPECT_NEAR(plan_param_counts(preset("llama3-70b")).total / 1e9, 70.55, 0.01);
  EXPECT_NEAR(plan_param_counts(preset("llama3-405b")).total / 1e9, 405.85, 0.01);
}

TEST(PlanModel, TensorParallelSplitKeepsNormsAndOutputBiasesWhole) {
  const PlanModel m = preset("gpt2-124m");
  const uint64_t d = 768;
  // Split: QKV (3d² + 3d), proj (d²), fc (4d² + 4d), fc proj (4d²); whole: 2 norms (4d), 2 output biases
  // (2d).
  EXPECT_EQ(plan_layer_params_per_rank(m, 4), (12 * d * d + 7 * d) / 4 + 6 * d);
  EXPECT_EQ(plan_layer_params_per_rank(m, 1), plan_param_counts(m).per_layer);
}

TEST(PlanModel, PresetsAndValidation) {
  EXPECT_EQ(plan_model_preset_names().size(), 6u);
  Result<PlanModel> bad = plan_model_preset("gpt5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("llama3-405b"), std::string::npos) << bad.error();
  PlanModel m = preset("gpt2-124m");
  m.heads = 7;
  Status s = plan_model_validate(m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.heads = 7"), std::string::npos) << s.message();
}

TEST(PlanFlops, GantryConventionIsSixNPlusSixLdT) {
  const PlanModel m = preset("gpt2-124m");
  EXPECT_DOUBLE_EQ(plan_flops_per_token(m).gantry, 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
}

TEST(PlanFlops, MegatronConventionIsKorthikantisFormula) {
  // 72·B·s·l·h²·(1 + s/6h + V/12lh) per step, i.e. per token without B·s.
  const PlanModel m = gpt3_shaped(48, 6144, 64);
  const double l = 48, h = 6144, s = m.seq, V = m.vocab;
  EXPECT_NEAR(plan_flops_per_token(m).megatron / (72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))), 1.0,
              1e-12);
  // Full recompute adds a forward of the blocks: Narayanan et al. 2021 eq. (3), 96Bslh²(1 + s/6h + V/16lh).
  EXPECT_NEAR(plan_hardware_flops_per_token(m, Recompute::kFull, FlopConvention::kMegatron) /
                  (96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))),
              1.0, 1e-12);
  // Selective: Korthikanti et al. 2022 appendix A, 72Bslh²(1 + s/3h + V/12lh).
  EXPECT_NEAR(plan_hardware_flops_per_token(m, Recompute::kSelective, FlopConvention::kMegatron) /
                  (72 * l * h * h * (1 + s / (3 * h) + V / (12 * l * h))),
              1.0, 1e-12);
}

// Korthikanti et al. 2022 by hand for the 22B shape (s 2048, b 1, h 6144, a 64, dropout, no flash):
// sbh = 12,582,912 and 5as/h = 320/3.
class KorthikantiActivations : public ::testing::Test {
 protected:
  PlanModel m = gpt3_shaped(48, 6144, 64);
  const double sbh = 2048.0 * 6144.0;
  const double core = 5.0 * 64 * 2048 / 6144;
  double bytes(int tp, bool sp, Recompute r) {
    return plan_activation_layer_bytes(
        m,
        ActivationShape{
            .micro_batch = 1, .tp = tp, .sequence_parallel = sp, .recompute = r, .flash_attention = false});
  }
};

TEST_F(KorthikantiActivations, NoParallelismIs34PlusFiveAsOverH) {
  EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kNone), sbh * (34 + core));
  EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kNone), 1769996288.0);
}

TEST_F(KorthikantiActivations, TensorParallelLeavesTenUnsplit) {
  EXPECT_DOUBLE_EQ(bytes(8, false, Recompute::kNone), sbh * (10 + 24.0 / 8 + core / 8));
}

TEST_F(KorthikantiActivations, SequenceParallelSplitsEverything) {
  EXPECT_DOUBLE_EQ(bytes(8, true, Recompute::kNone), sbh / 8 * (34 + core));
}

TEST_F(KorthikantiActivations, SelectiveRecomputeDropsTheAttentionCore) {
  EXPECT_DOUBLE_EQ(bytes(8, true, Recompute::kSelective), sbh * 34 / 8);
  EXPECT_DOUBLE_EQ(bytes(8, false, Recompute::kSelective), sbh * (10 + 24.0 / 8));
}

TEST_F(KorthikantiActivations, FullRecomputeKeepsTheLayerInput) {
  EXPECT_DOUBLE_EQ(bytes(8, false, Recompute::kFull), 2 * sbh);
  EXPECT_DOUBLE_EQ(bytes(8, true, Recompute::kFull), 2 * sbh / 8);
  // While a recomputed layer runs backward it holds its whole set again.
  EXPECT_DOUBLE_EQ(plan_activation_recompute_working_bytes(
                       m, ActivationShape{.tp = 8, .sequence_parallel = true, .recompute = Recompute::kFull}),
                   sbh / 8 * (34 + core));
}

TEST_F(KorthikantiActivations, EmbeddingAndOutputExtras) {
  // §4.3: embedding dropout sbh/t (per micro-batch in flight); final norm and head inputs 4sbh/t and fp32
  // logits 4sbv/t.
  const ActivationShape a{.tp = 8, .sequence_parallel = true};
  EXPECT_DOUBLE_EQ(plan_activation_embedding_bytes(m, a), sbh / 8);
  EXPECT_DOUBLE_EQ(plan_activation_output_bytes(m, a), 4 * sbh / 8 + 4.0 * 2048 * m.vocab / 8);
}

TEST(PlanActivations, WithoutDropoutAndWithFlashAttention) {
  PlanModel m = preset("gpt2-124m");  // no dropout: 32 + 2as/h
  const double sbh = 4.0 * 1024 * 768, as_h = 12.0 * 1024 / 768;
  EXPECT_DOUBLE_EQ(plan_activation_layer_bytes(m, ActivationShape{.micro_batch = 4}), sbh * (32 + 2 * as_h));
  // Flash attention stores only one fp32 log-sum-exp per head per token.
  EXPECT_DOUBLE_EQ(plan_activation_layer_bytes(m, ActivationShape{.micro_batch = 4, .flash_attention = true}),
                   sbh * (32 + 4.0 * 12 / 768));
}

TEST(PlanActivations, GroupedQueryAttentionAndSwiGlu) {
  // Llama 3 8B: norms 4 + QKV input 2 + MLP input 2; Q 2, K and V 2·(1024/4096) each, projection input 2;
  // gate, up and down inputs 3·2·(14336/4096); flash 4·32/4096.
  const PlanModel m = preset("llama3-8b");
  const double sbh = 8192.0 * 4096;
  const double per = 8 + (2 + 0.5 + 0.5 + 2) + 6 * 3.5 + 4.0 * 32 / 4096;
  EXPECT_DOUBLE_EQ(plan_activation_layer_bytes(m, ActivationShape{.flash_attention = true}), sbh * per);
  // Context parallelism holds s/cp of the sequence.
  EXPECT_DOUBLE_EQ(plan_activation_layer_bytes(m, ActivationShape{.cp = 4, .flash_attention = true}),
                   sbh * per / 4);
}

TEST(PlanPipeline, MicrobatchesInFlight) {
  EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::kGpipe, 8, 1, 64, 0), 64);
  EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::k1F1B, 8, 1, 64, 0), 8);  // p on the first stage
  EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::k1F1B, 8, 1, 64, 7), 1);
  EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::k1F1B, 8, 1, 3, 0),
                   3);  // fewer micro-batches than stages
  // Interleaved, first stage: p·(1 + (p − 1)/(p·v)) (Korthikanti et al. 2022 §4.2.3).
  for (int p : {2, 4, 8, 16}) {
    for (int v : {2, 3, 4}) {
      EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::kInterleaved, p, v, 8 * p, 0),
                       p * (1 + (p - 1.0) / (p * v)))
          << p << " " << v;
    }
  }
}

TEST(PlanPipeline, BubbleFractions) {
  // Narayanan et al. 2021 §2.2: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved.
  EXPECT_DOUBLE_EQ(plan_bubble_fraction(Schedule::kGpipe, 4, 1, 8), 3.0 / 8);
  EXPECT_DOUBLE_EQ(plan_bubble_fraction(Schedule::k1F1B, 4, 1, 8), 3.0 / 8);
  EXPECT_DOUBLE_EQ(plan_bubble_fraction(Schedule::kInterleaved, 4, 2, 8), 3.0 / 16);
  EXPECT_DOUBLE_EQ(plan_bubble_fraction(Schedule::k1F1B, 1, 1, 8), 0);
  // ZB-H1 (Qi et al. 2023 §3.1): a third of 1F1B's, (p − 1)/(3m) of the ideal step, (p − 1)/(3m + p − 1)
  // of the step.
  EXPECT_DOUBLE_EQ(plan_bubble_fraction(Schedule::kZeroBubbleH1, 4, 1, 8), 3.0 / 24);
  EXPECT_DOUBLE_EQ(plan_bubble_step_fraction(Schedule::kZeroBubbleH1, 4, 1, 8), 3.0 / 27);
  EXPECT_DOUBLE_EQ(plan_bubble_step_fraction(Schedule::k1F1B, 4, 1, 8), 3.0 / 11);
  EXPECT_DOUBLE_EQ(plan_bubble_step_fraction(Schedule::kInterleaved, 4, 2, 8), 3.0 / 19);
}

TEST(PlanPipeline, ZeroBubbleH1HoldsPMicrobatchesOnEveryStage) {
  // Each micro-batch's activations wait for its deferred weight pass: min(p, m) on every stage.
  for (int stage = 0; stage < 8; ++stage) {
    EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::kZeroBubbleH1, 8, 1, 64, stage), 8);
    EXPECT_DOUBLE_EQ(plan_microbatches_in_flight(Schedule::kZeroBubbleH1, 8, 1, 3, stage), 3);
  }
  EXPECT_EQ(schedule_parse("zbh1").value(), Schedule::kZeroBubbleH1);
  EXPECT_STREQ(schedule_name(Schedule::kZeroBubbleH1), "zbh1");
  Result<Schedule> bad = schedule_parse("zb-v");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("allowed gpipe, 1f1b, zbh1"), std::string::npos) << bad.error();
}

TEST(PlanCluster, BusFactorsFromNcclTests) {
  // nccl-tests doc/PERFORMANCE.md, "Summary".
  EXPECT_DOUBLE_EQ(plan_bus_factor(Collective::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(plan_bus_factor(Collective::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(plan_bus_factor(Collective::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(plan_bus_factor(Collective::kSendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(plan_bus_factor(Collective::kAllReduce, 1), 0.0);
}

TEST(PlanCluster, AlphaBetaTime) {
  const GroupLink l{.bw = 100e9, .latency_s = 1e-5};
  // 2(n − 1) steps of alpha plus S·2(n − 1)/n over the bus bandwidth.
  EXPECT_DOUBLE_EQ(plan_collective_seconds(Collective::kAllReduce, 1e9, 4, l), 6 * 1e-5 + 1e9 * 1.5 / 100e9);
  EXPECT_DOUBLE_EQ(plan_collective_seconds(Collective::kAllGather, 1e9, 4, l), 3 * 1e-5 + 1e9 * 0.75 / 100e9);
  EXPECT_DOUBLE_EQ(plan_collective_seconds(Collective::kAllReduce, 1e9, 1, l), 0);
}

TEST(PlanCluster, GroupsInsideANodeUseNvlinkAcrossNodesTheNetwork) {
  ClusterSpec c = plan_cluster_default(plan_gpu_preset("h100").value(), 64);
  EXPECT_DOUBLE_EQ(c.intra_bw, 0.8 * 450e9);
  EXPECT_DOUBLE_EQ(c.inter_bw, 0.8 * 50e9);
  EXPECT_FALSE(plan_group_link(c, 8, 1).crosses_nodes);            // tp 8 in a node
  EXPECT_DOUBLE_EQ(plan_group_link(c, 8, 8).bw, c.inter_bw);       // dp across nodes, one rank per node
  EXPECT_DOUBLE_EQ(plan_group_link(c, 16, 2).bw, 4 * c.inter_bw);  // four ranks per node: four NICs
  EXPECT_DOUBLE_EQ(plan_group_link(c, 64, 1).bw, 8 * c.inter_bw);  // eight ranks per node: eight NICs
  c.inter_bw = 100e9;
  EXPECT_DOUBLE_EQ(plan_group_link(c, 64, 1).bw, c.intra_bw);  // more than NVLink carries: capped
  EXPECT_EQ(plan_gpu_preset_names().size(), 5u);
  EXPECT_FALSE(plan_gpu_preset("v100").ok());
}

TEST(PlanReliability, YoungAndDalyOnDalysExamples) {
  // Daly 2006, figs. 3–5: δ = 5 min, R = 10 min; M = 24 h → τ_opt = 117 min, 6 h → 57 min, 15 min → 9.1 min.
  EXPECT_NEAR(daly_interval(5, 24 * 60), 117, 0.5);
  EXPECT_NEAR(daly_interval(5, 6 * 60), 57, 0.5);
  EXPECT_NEAR(daly_interval(5, 15), 9.1, 0.05);
  EXPECT_DOUBLE_EQ(young_interval(5, 24 * 60), 120);  // sqrt(2·5·1440)
  EXPECT_DOUBLE_EQ(daly_interval(40, 15), 15);        // δ >= 2M: checkpoint every M
}

TEST(PlanReliability, DalysIntervalMinimisesHisExpectedWallTime) {
  for (double mtbf : {15.0, 360.0, 1440.0}) {
    const double tau = daly_interval(5, mtbf);
    const double at = daly_wall_time(30000, tau, 5, 10, mtbf);
    for (double f : {0.7, 0.85, 1.15, 1.4}) {
      EXPECT_LT(at, daly_wall_time(30000, tau * f, 5, 10, mtbf)) << mtbf << " " << f;
    }
  }
  EXPECT_DOUBLE_EQ(checkpoint_goodput(100, 0, 0, 0), 1.0);  // no failures, free checkpoints
  const double g = checkpoint_goodput(daly_interval(5, 1440), 5, 10, 1440);
  EXPECT_GT(g, 0.9);
  EXPECT_LT(g, 0.95);
}

PlanInput small_input() {
  PlanInput in;
  in.model = preset("gpt2-124m");
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 8);
  in.training.global_batch = 64;
  return in;
}

TEST(Planner, BucketsFollowTheBytesPerParameterAndZero) {
  PlanInput in = small_input();
  in.layout = PlanLayout{.zero = 0, .micro_batch = 8};
  Result<Plan> p0 = plan_evaluate(in);
  ASSERT_TRUE(p0.ok()) << p0.error();
  const double n = 124475904;
  EXPECT_EQ(p0->params_on_gpu, 124475904u);
  EXPECT_DOUBLE_EQ(p0->memory.weights, 2 * n);
  EXPECT_DOUBLE_EQ(p0->memory.gradients, 2 * n);
  EXPECT_DOUBLE_EQ(p0->memory.optimizer, 12 * n);  // the 16 bytes per parameter of mixed-precision Adam
  for (int zero : {1, 2, 3}) {
    in.layout.zero = zero;
    Result<Plan> p = plan_evaluate(in);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_DOUBLE_EQ(p->memory.optimizer, 12 * n / 8) << zero;
    EXPECT_DOUBLE_EQ(p->memory.gradients, zero >= 2 ? 2 * n / 8 : 2 * n) << zero;
    EXPECT_DOUBLE_EQ(p->memory.weights, zero >= 3 ? 2 * n / 8 : 2 * n) << zero;
  }
  in.layout.zero = 1;
  in.layout.hsdp = 4;  // shard over 4, replicate twice
  Result<Plan> h = plan_evaluate(in);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_DOUBLE_EQ(h->memory.optimizer, 12 * n / 4);
  EXPECT_NE(h->comm.back().pattern.find("2 replicas"), std::string::npos) << h->comm.back().pattern;
}

TEST(Planner, ActivationsOfTheFirstStageAreKorthikantisTotal) {
  // 1F1B with m >= p: the first stage holds p micro-batches of L/p layers = L layers' worth, plus the
  // embedding dropout masks of its p micro-batches (Korthikanti et al. 2022 §4.2.3, §4.3).
  PlanInput in;
  in.model = gpt3_shaped(96, 12288, 96);
  in.cluster = plan_cluster_default(plan_gpu_preset("a100-80gb").value(), 64);
  in.layout = PlanLayout{.tp = 8, .pp = 8, .recompute = Recompute::kSelective, .flash_attention = false};
  in.training.global_batch = 64;
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  ASSERT_EQ(p->memory_stage, 0);
  const double sbh = 2048.0 * 12288;
  EXPECT_DOUBLE_EQ(p->memory.activations, sbh * 96 / 8 * (34 + 8.0 / 96));
  EXPECT_DOUBLE_EQ(p->microbatches_in_flight, 8);
  EXPECT_TRUE(p->fits);
}

TEST(Planner, StepTimeAddsUpAndThroughputFollows) {
  PlanInput in = small_input();
  in.cluster.gpus = 16;
  in.layout = PlanLayout{.tp = 2, .pp = 2, .vp = 2, .zero = 1, .micro_batch = 2};
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->layout.dp, 4);
  EXPECT_EQ(p->layout.schedule, Schedule::kInterleaved);
  EXPECT_EQ(p->micro_batches, 8);
  EXPECT_DOUBLE_EQ(p->bubble_fraction, 1.0 / 16);
  EXPECT_NEAR(p->step_s, p->compute_s + p->bubble_s + p->exposed_comm_s + p->optimizer_s, 1e-12);
  EXPECT_NEAR(p->tokens_per_s, 64.0 * 1024 / p->step_s, 1e-6);
  ASSERT_EQ(p->comm.size(), 3u);  // tp, pp, dp
  for (const CommAxis& a : p->comm) {
    EXPECT_NEAR(a.exposed_s + a.overlappable_s, a.seconds, 1e-12) << a.axis;
    EXPECT_GT(a.bytes, 0) << a.axis;
  }
  EXPECT_GT(p->mfu, 0);
  EXPECT_LT(p->mfu, p->hfu + 1e-12);
  EXPECT_NEAR(p->days_to_train, 20.0 * 124475904 / p->tokens_per_s / 86400, 1e-9);
  EXPECT_DOUBLE_EQ(p->checkpoint_bytes, 12.0 * 124475904);
  EXPECT_NEAR(p->cluster_mtbf_s, kDefaultNodeMtbfHours * 3600 / 2, 1e-6);
  EXPECT_GT(p->goodput, 0.99);
}

TEST(Planner, RecomputationTradesMemoryForTime) {
  PlanInput in = small_input();
  in.layout = PlanLayout{.flash_attention = false, .micro_batch = 8};
  in.layout.recompute = Recompute::kNone;
  Plan none = plan_evaluate(in).value();
  in.layout.recompute = Recompute::kSelective;
  Plan sel = plan_evaluate(in).value();
  in.layout.recompute = Recompute::kFull;
  Plan full = plan_evaluate(in).value();
  EXPECT_GT(none.memory.activations, sel.memory.activations);
  EXPECT_GT(sel.memory.activations, full.memory.activations);
  EXPECT_LT(none.step_s, sel.step_s);
  EXPECT_LT(sel.step_s, full.step_s);
  EXPECT_DOUBLE_EQ(none.mfu * none.step_s, full.mfu * full.step_s);  // same model FLOPs
}

TEST(Planner, AModelTooBigForItsGpusDoesNotFit) {
  // 70B parameters at 16 bytes each, unsharded, on one 80 GB GPU's worth of memory per rank.
  PlanInput in;
  in.model = preset("llama3-70b");
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 8);
  in.layout = PlanLayout{.zero = 0};
  in.training.global_batch = 64;
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_FALSE(p->fits);
  EXPECT_GT(p->memory.total(), 16.0 * 70e9);
}

TEST(Planner, BadLayoutsNameTheFieldAndWhatIsAllowed) {
  PlanInput in = small_input();
  auto error = [&](PlanLayout l) {
    in.layout = l;
    Result<Plan> p = plan_evaluate(in);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.error();
  };
  EXPECT_EQ(error({.tp = 5}).rfind("tp = 5: must be >= 1 and divide heads (12)", 0), 0u) << error({.tp = 5});
  EXPECT_EQ(error({.tp = 2, .pp = 3}).rfind("gpus = 8: must be a multiple of tp·cp·pp = 6", 0), 0u);
  EXPECT_EQ(error({.dp = 3}).rfind("dp = 3: tp·cp·pp·dp must equal gpus (8), so dp = 8", 0), 0u);
  EXPECT_EQ(error({.zero = 4}).rfind("zero = 4: allowed 0, 1, 2, 3", 0), 0u);
  EXPECT_EQ(error({.vp = 2}).rfind("vp = 2:", 0), 0u);
  EXPECT_EQ(error({.hsdp = 2}).rfind("hsdp = 2:", 0), 0u);  // needs zero >= 1
  EXPECT_EQ(error({.micro_batch = 3}).rfind("global_batch = 64: must be a multiple of dp × micro_batch", 0),
            0u);
  EXPECT_EQ(error({.cp = 3}).rfind("cp = 3:", 0), 0u);
  in.cluster.gpus = 16;
  EXPECT_EQ(error({.pp = 2, .vp = 2, .micro_batch = 8}).rfind("micro-batches per step = 1:", 0), 0u);
}

TEST(Planner, DefaultGlobalBatchIsAMillionTokens) {
  PlanInput in = small_input();
  in.training.global_batch = 0;
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->global_batch, 1024);  // 2^20 / 1024
}

TEST(PlanSearch, FindsTheFittingLayoutsBestFirst) {
  PlanInput in;
  in.model = preset("llama3-8b");
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 16);
  in.training.global_batch = 128;
  Result<SearchResult> r = plan_search(in, SearchOptions{.top = 5});
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->plans.size(), 5u);
  EXPECT_GT(r->evaluated, r->fitting);  // some layouts do not fit
  EXPECT_GT(r->fitting, 5);
  for (size_t i = 0; i < r->plans.size(); ++i) {
    EXPECT_TRUE(r->plans[i].fits);
    if (i > 0) {
      EXPECT_GE(r->plans[i - 1].tokens_per_s, r->plans[i].tokens_per_s);
    }
    const PlanLayout& l = r->plans[i].layout;
    EXPECT_EQ(l.tp * l.cp * l.pp * l.dp, 16);
  }
  // The winner is at least as fast as a hand-picked layout that fits.
  in.layout = PlanLayout{.tp = 8, .zero = 1, .recompute = Recompute::kFull};
  Result<Plan> hand = plan_evaluate(in);
  ASSERT_TRUE(hand.ok()) << hand.error();
  ASSERT_TRUE(hand->fits);
  EXPECT_GE(r->plans[0].tokens_per_s, hand->tokens_per_s);

  Result<SearchResult> g = plan_search(in, SearchOptions{.top = 3, .rank = SearchRank::kGoodput});
  ASSERT_TRUE(g.ok());
  for (size_t i = 1; i < g->plans.size(); ++i) {
    EXPECT_GE(g->plans[i - 1].tokens_per_s * g->plans[i - 1].goodput,
              g->plans[i].tokens_per_s * g->plans[i].goodput);
  }
  EXPECT_FALSE(plan_search(in, SearchOptions{.top = 0}).ok());
}

// ---- Tensor-parallel communication and its overlap (issue 17).

// Four GPT-3 175B blocks (d 12288, T 2048) on H100s, tp over all of them (dp 1), 4 micro-batches of one
// sequence: the GEMMs are wide enough that NVLink's collectives fit under them at tp 2.
Result<Plan> tp_plan(int tp, double overlap, int gpus_per_node = 8, double intra_bw = 0) {
  PlanInput in;
  in.model = gpt3_shaped(4, 12288, 96);
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), tp, gpus_per_node);
  if (intra_bw > 0) in.cluster.intra_bw = intra_bw;
  in.layout = PlanLayout{.tp = tp, .sequence_parallel = false, .micro_batch = 1};
  in.training.global_batch = 4;
  in.training.tp_overlap = overlap;
  return plan_evaluate(in);
}

const CommAxis* axis_of(const Plan& p, const std::string& name) {
  for (const CommAxis& a : p.comm)
    if (a.axis == name) return &a;
  return nullptr;
}

TEST(PlannerTensorParallel, TheOverlapRuleHidesUpToTheProduct) {
  EXPECT_DOUBLE_EQ(plan_tp_exposed_seconds(5, 3, 0), 5);  // no overlap: all of it exposed
  EXPECT_DOUBLE_EQ(plan_tp_exposed_seconds(5, 3, 1), 2);  // the product hides 3 of 5
  EXPECT_DOUBLE_EQ(plan_tp_exposed_seconds(1, 3, 1), 0);  // never below zero
  EXPECT_DOUBLE_EQ(plan_tp_exposed_seconds(5, 3, 0.5), 3.5);
}

TEST(PlannerTensorParallel, MoreTpSendsMoreBytesPerGpuAndTakesLonger) {
  double last_wire = 0, last_seconds = 0, last_share = 0;
  for (int tp : {2, 4, 8}) {
    Result<Plan> p = tp_plan(tp, 0);
    ASSERT_TRUE(p.ok()) << p.error();
    const CommAxis* a = axis_of(p.value(), "tp");
    ASSERT_NE(a, nullptr);
    // Each GPU's wire bytes: S·2(n−1)/n per all-reduce, 4 a layer a micro-batch.
    const double wire = a->bytes * plan_bus_factor(Collective::kAllReduce, tp);
    EXPECT_GT(wire, last_wire) << "tp " << tp;
    EXPECT_GT(a->seconds, last_seconds) << "tp " << tp;
    // ... against compute that shrinks as 1/tp: communication's share of the step grows.
    const double share = a->exposed_s / p->step_s;
    EXPECT_GT(share, last_share) << "tp " << tp;
    last_wire = wire, last_seconds = a->seconds, last_share = share;
    EXPECT_DOUBLE_EQ(a->exposed_s, a->seconds) << "no overlap asked for";
  }
}

TEST(PlannerTensorParallel, OverlapHidesCommunicationUpToTheCompute) {
  // tp 2 on NVLink: every collective is shorter than the GEMM beside it, so full overlap hides all of it.
  Result<Plan> none = tp_plan(2, 0), full = tp_plan(2, 1);
  ASSERT_TRUE(none.ok() && full.ok());
  const CommAxis* a0 = axis_of(none.value(), "tp");
  const CommAxis* a1 = axis_of(full.value(), "tp");
  ASSERT_TRUE(a0 != nullptr && a1 != nullptr);
  EXPECT_DOUBLE_EQ(a1->seconds, a0->seconds) << "overlap moves no fewer bytes";
  EXPECT_DOUBLE_EQ(a1->exposed_s, 0);
  EXPECT_NEAR(a1->overlappable_s, a1->seconds, 1e-15);
  EXPECT_NEAR(none->step_s - full->step_s, a0->seconds, 1e-12);
  // A link so slow that the collectives outlast the GEMMs: only the GEMMs' time is hidden, the rest stays.
  Result<Plan> slow0 = tp_plan(2, 0, 8, 1e8), slow1 = tp_plan(2, 1, 8, 1e8);
  ASSERT_TRUE(slow0.ok() && slow1.ok());
  const CommAxis* s1 = axis_of(slow1.value(), "tp");
  ASSERT_NE(s1, nullptr);
  EXPECT_GT(s1->exposed_s, 0);
  EXPECT_LT(s1->exposed_s, s1->seconds);
  EXPECT_GE(s1->exposed_s, s1->seconds - slow1->compute_s) << "hidden at most under the compute";
  EXPECT_LT(slow1->step_s, slow0->step_s);
  // Half the overlap hides less.
  Result<Plan> half = tp_plan(2, 0.5, 8, 1e8);
  ASSERT_TRUE(half.ok());
  EXPECT_GT(axis_of(half.value(), "tp")->exposed_s, s1->exposed_s);
  EXPECT_GT(half->step_s, slow1->step_s);
}

TEST(PlannerTensorParallel, ASlowerTierMakesASlowerStep) {
  // tp 8 inside one node (NVLink) against tp 8 over two nodes of 4 (the network): same bytes, slower link.
  Result<Plan> nvlink = tp_plan(8, 0, 8), network = tp_plan(8, 0, 4);
  ASSERT_TRUE(nvlink.ok() && network.ok());
  const CommAxis* fast = axis_of(nvlink.value(), "tp");
  const CommAxis* slow = axis_of(network.value(), "tp");
  ASSERT_TRUE(fast != nullptr && slow != nullptr);
  EXPECT_FALSE(fast->crosses_nodes);
  EXPECT_TRUE(slow->crosses_nodes);
  EXPECT_LT(slow->bus_bw, fast->bus_bw);
  EXPECT_DOUBLE_EQ(slow->bytes, fast->bytes);
  EXPECT_GT(slow->seconds, fast->seconds);
  EXPECT_GT(network->step_s, nvlink->step_s);
  // Overlap does not make the slow tier free: the network's collectives outlast what the GEMMs hide.
  Result<Plan> nvlink1 = tp_plan(8, 1, 8), network1 = tp_plan(8, 1, 4);
  ASSERT_TRUE(nvlink1.ok() && network1.ok());
  EXPECT_GT(network1->step_s, nvlink1->step_s);
}

TEST(PlannerTensorParallel, OverlapOutsideZeroToOneIsRefused) {
  for (double bad : {-0.1, 1.5}) {
    Result<Plan> p = tp_plan(2, bad);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.error().find("tp_overlap"), std::string::npos) << p.error();
    EXPECT_NE(p.error().find("allowed 0..1"), std::string::npos) << p.error();
  }
}

}  // namespace
}  // namespace gantry
