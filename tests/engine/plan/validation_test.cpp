// The planner against published runs. Every number below comes from the source named beside it; the
// planner's inputs are the published configurations, its outputs are compared with the published results.
// docs/PLANNER.md carries the same table with the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/plan/cluster.h"
#include "engine/plan/model.h"
#include "engine/plan/planner.h"

namespace gantry {
namespace {

PlanModel gpt3_shaped(int layers, int hidden, int heads) {
  // Megatron's GPT models: vocabulary 51,200, sequence 2,048 (Narayanan et al. 2021 §5.1, Korthikanti et al.
  // 2022 §6), GELU 4h, learned positions, tied embeddings, dropout on.
  PlanModel m = plan_model_preset("gpt3-175b").value();
  m.name = "gpt";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  return m;
}

// ---- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models".
// Table 3 (configurations: heads, hidden, layers, tensor- and pipeline-parallel size, GPUs, global batch;
// sequence 2,048, vocabulary 51,200, A100 80GB, peak 312 TFLOP/s) and Table 5 (end-to-end iteration time
// with sequence parallelism and selective recomputation, model and hardware FLOPs utilization; the MFU/HFU
// pairs are also in Megatron-LM's README).
struct KorthikantiRun {
  const char* name;
  int heads, hidden, layers, tp, pp, gpus, global_batch;
  double iteration_s, mfu, hfu;
};
constexpr KorthikantiRun kKorthikanti[] = {
    {"22B", 64, 6144, 48, 8, 1, 8, 4, 1.10, 0.415, 0.437},
    {"175B", 96, 12288, 96, 8, 8, 64, 64, 13.75, 0.514, 0.528},
    {"530B", 128, 20480, 105, 8, 35, 280, 280, 37.83, 0.560, 0.570},
    {"1T", 160, 25600, 128, 8, 64, 512, 512, 71.49, 0.563, 0.570},
};

TEST(ValidationKorthikanti, MfuAndHfuFromThePublishedIterationTimesWithinHalfAPoint) {
  for (const KorthikantiRun& k : kKorthikanti) {
    const PlanModel m = gpt3_shaped(k.layers, k.hidden, k.heads);
    const Utilization u = plan_utilization(m, Recompute::kSelective, k.global_batch, k.iteration_s, k.gpus,
                                           312e12, FlopConvention::kMegatron);
    EXPECT_NEAR(u.mfu, k.mfu, 0.005) << k.name;
    EXPECT_NEAR(u.hfu, k.hfu, 0.005) << k.name;
    std::printf("[korthikanti %s] MFU %.2f%% (published %.1f%%), HFU %.2f%% (published %.1f%%)\n", k.name,
                100 * u.mfu, 100 * k.mfu, 100 * u.hfu, 100 * k.hfu);
  }
}

PlanInput korthikanti_input(const KorthikantiRun& k) {
  PlanInput in;
  in.model = gpt3_shaped(k.layers, k.hidden, k.heads);
  in.cluster = plan_cluster_default(plan_gpu_preset("a100-80gb").value(), k.gpus);
  // Micro-batch 1 and the plain 1F1B schedule: the paper does not list them in Table 3.
  in.layout = PlanLayout{.tp = k.tp,
                         .pp = k.pp,
                         .sequence_parallel = true,
                         .recompute = Recompute::kSelective,
                         .flash_attention = false,
                         .micro_batch = 1};
  in.training.global_batch = k.global_batch;
  in.training.mfu_convention = FlopConvention::kMegatron;
  return in;
}

TEST(ValidationKorthikanti, PredictedIterationTimesFitAndStayWithinAQuarter) {
  // Not a calibration target: Megatron's 2022 kernels beat the 2021 stack the A100 figure comes from, so
  // the prediction is slower than published (docs/PLANNER.md). This guards the size of that gap.
  for (const KorthikantiRun& k : kKorthikanti) {
    Result<Plan> p = plan_evaluate(korthikanti_input(k));
    ASSERT_TRUE(p.ok()) << k.name << ": " << p.error();
    EXPECT_TRUE(p->fits) << k.name;  // they ran on 80 GB A100s
    const double err = p->step_s / k.iteration_s - 1;
    EXPECT_LT(std::fabs(err), 0.25) << k.name;
    std::printf("[korthikanti %s] predicted %.2f s vs %.2f s (%+.1f%%), MFU %.1f%%, memory %.1f GiB\n",
                k.name, p->step_s, k.iteration_s, 100 * err, 100 * p->mfu, p->memory.total() / (1 << 30));
  }
}

// ---- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM". GPT-3 175B (96 layers, hidden 12,288, 96 heads), batch 1,536, micro-batch 1, A100 80GB,
// activation recomputation (eq. 3 counts its extra forward), fp16 weights with fp32 gradients, master
// weights and Adam (18 bytes per parameter), interleaved schedule (§5.1; two model chunks per device is
// our assumption), no sequence parallelism (it came in 2022).
PlanInput narayanan_input(int gpus, int pp) {
  PlanInput in;
  in.model = plan_model_preset("gpt3-175b").value();
  in.cluster = plan_cluster_default(plan_gpu_preset("a100-80gb").value(), gpus);
  in.layout = PlanLayout{.tp = 8,
                         .pp = pp,
                         .vp = 2,
                         .sequence_parallel = false,
                         .recompute = Recompute::kFull,
                         .flash_attention = false,
                         .micro_batch = 1};
  in.training.global_batch = 1536;
  in.training.grad_bytes = 4;
  in.training.mfu_convention = FlopConvention::kMegatron;
  return in;
}

// Per-GPU throughput in the paper's own terms: eq. (3)'s FLOPs per iteration over the iteration time.
double narayanan_tflops(const Plan& p) {
  return p.hardware_flops_per_token * p.global_batch * 2048 / p.step_s / p.gpus / 1e12;
}

TEST(ValidationNarayanan, Gpt3On1024GpusThroughputWithinTenPercentAndItFits) {
  // §5.1: "On n = 1024 A100 GPUs using batch size 1536, we achieve X = 140 teraFLOP/s per GPU." The layout
  // (TP 8, PP 16, DP 8) is issue #7's reading; the paper does not print it for this run.
  Result<Plan> p = plan_evaluate(narayanan_input(1024, 16));
  ASSERT_TRUE(p.ok()) << p.error();
  const double tflops = narayanan_tflops(p.value());
  EXPECT_NEAR(tflops / 140.0, 1.0, 0.10) << tflops;
  // The paper prints no per-GPU memory for this run; it ran on 80 GB A100s, so the plan must fit, and the
  // model state must be exactly 18 bytes per parameter the GPU owns (no ZeRO).
  EXPECT_TRUE(p->fits);
  EXPECT_LT(p->memory.total(), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(p->memory.weights + p->memory.gradients + p->memory.optimizer, 18.0 * p->params_on_gpu);
  EXPECT_EQ(p->layout.dp, 8);
  EXPECT_EQ(p->micro_batches, 192);
  EXPECT_DOUBLE_EQ(p->bubble_fraction, 15.0 / (2 * 192));
  std::printf("[narayanan 1024] %.1f TFLOP/s per GPU vs 140 (%+.1f%%), memory %.1f GiB, step %.2f s\n",
              tflops, 100 * (tflops / 140 - 1), p->memory.total() / (1 << 30), p->step_s);
  // The end-to-end estimate of §5.1 (8TP/nX = 34 days for 300B tokens) from the same plan.
  PlanInput in = narayanan_input(1024, 16);
  in.training.tokens = 300e9;
  Result<Plan> days = plan_evaluate(in);
  ASSERT_TRUE(days.ok());
  EXPECT_NEAR(days->days_to_train / 34.0, 1.0, 0.10) << days->days_to_train;
  std::printf("[narayanan 1024] 300B tokens in %.1f days vs 34 (%+.1f%%)\n", days->days_to_train,
              100 * (days->days_to_train / 34 - 1));
}

TEST(ValidationNarayanan, Table2ThroughputAcrossScale) {
  // Table 2, PTD parallelism, 174.6B model, model-parallel size 96 (TP 8 × PP 12), batch 1,536,
  // micro-batch 1: 384 GPUs 153, 768 GPUs 149, 1,536 GPUs 141 TFLOP/s per GPU. The 384-GPU row is the
  // A100 calibration point (cluster.cpp); the other two are held out.
  struct Row {
    int gpus;
    double tflops;
    double tolerance;
  };
  for (const Row& r : {Row{384, 153, 0.02}, Row{768, 149, 0.10}, Row{1536, 141, 0.10}}) {
    Result<Plan> p = plan_evaluate(narayanan_input(r.gpus, 12));
    ASSERT_TRUE(p.ok()) << p.error();
    const double tflops = narayanan_tflops(p.value());
    EXPECT_NEAR(tflops / r.tflops, 1.0, r.tolerance) << r.gpus;
    std::printf("[narayanan table 2, %d GPUs] %.1f vs %.0f TFLOP/s (%+.1f%%)\n", r.gpus, tflops, r.tflops,
                100 * (tflops / r.tflops - 1));
  }
}

TEST(ValidationNarayanan, TrillionParameterCheckpointSize) {
  // §5.10: "the trillion-parameter model has a checkpoint of size 13.8 terabytes" (Table 1: 128 layers,
  // hidden 25,600, 160 heads). Megatron stores fp16 weights, fp32 master weights and Adam's two moments:
  // 14 bytes per parameter.
  PlanInput in;
  in.model = gpt3_shaped(128, 25600, 160);
  in.cluster = plan_cluster_default(plan_gpu_preset("a100-80gb").value(), 3072);
  in.layout = PlanLayout{.tp = 8, .pp = 64, .recompute = Recompute::kFull, .flash_attention = false};
  in.training.global_batch = 3072;
  in.training.checkpoint_bytes_per_param = 14;
  in.training.checkpoint_write_bw = 273e9;  // §5.10: saves reach 273 GB/s
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_NEAR(p->params / 1e9, 1008.0, 0.05);  // Table 1: 1008.0 billion
  EXPECT_NEAR(p->checkpoint_bytes / 13.8e12, 1.0, 0.03);
  std::printf("[narayanan 1T checkpoint] %.2f TB vs 13.8 TB (%+.1f%%), %.0f s at 273 GB/s\n",
              p->checkpoint_bytes / 1e12, 100 * (p->checkpoint_bytes / 13.8e12 - 1), p->checkpoint_write_s);
}

// ---- MosaicML llm-foundry, scripts/train/benchmarking/README.md: MPT models (GPT-2-style blocks with
// biases, learned positions, vocabulary 50,368), FSDP FULL_SHARD (ZeRO-3) over all GPUs, flash attention,
// "Activation Checkpointing" = full recomputation, bf16; tables "H100 80GB BF16" and "A100 80GB with
// 1600 Gbps node-node interconnect (RoCE)". Global batch = micro-batch × grad accumulation × GPUs.
struct MptRun {
  const char* size;
  int seq, gpus, micro_batch, accum;
  bool checkpointing;
  double tokens_per_s_per_gpu;  // "Throughput (T/s/GPU)"
  uint64_t params;              // "NumParams"
};

PlanModel mpt(const std::string& size, int seq) {
  struct Dims {
    const char* size;
    int hidden, layers, heads;
  };
  // llm-foundry's scripts/train/yamls/pretrain/mpt-*.yaml.
  constexpr Dims kDims[] = {{"125m", 768, 12, 12}, {"350m", 1024, 24, 16}, {"760m", 1536, 24, 12},
                            {"1b", 2048, 24, 16},  {"3b", 2560, 32, 20},   {"7b", 4096, 32, 32},
                            {"13b", 5120, 40, 40}, {"30b", 7168, 48, 64},  {"70b", 8192, 80, 64}};
  PlanModel m;
  m.name = "mpt-" + size;
  m.vocab = 50368;
  m.seq = seq;
  for (const Dims& d : kDims) {
    if (size == d.size) {
      m.hidden = d.hidden;
      m.layers = d.layers;
      m.heads = d.heads;
    }
  }
  return m;
}

struct MptResult {
  double error;
  uint64_t params;
};

MptResult run_mpt(const char* gpu, const MptRun& r) {
  PlanInput in;
  in.model = mpt(r.size, r.seq);
  in.cluster = plan_cluster_default(plan_gpu_preset(gpu).value(), r.gpus);
  in.layout = PlanLayout{.zero = 3,
                         .recompute = r.checkpointing ? Recompute::kFull : Recompute::kNone,
                         .flash_attention = true,
                         .micro_batch = r.micro_batch};
  in.training.global_batch = r.micro_batch * r.accum * r.gpus;
  Result<Plan> p = plan_evaluate(in);
  EXPECT_TRUE(p.ok()) << r.size << ": " << p.error();
  if (!p.ok()) return {1e9, 0};
  EXPECT_TRUE(p->fits) << gpu << " " << r.size << " " << r.seq;
  const double err = p->tokens_per_s / r.gpus / r.tokens_per_s_per_gpu - 1;
  std::printf("[mosaicml %s %s seq %d, %d GPUs, mb %d%s] %.0f vs %.0f tokens/s/GPU (%+.1f%%)\n", gpu, r.size,
              r.seq, r.gpus, r.micro_batch, r.checkpointing ? ", recompute" : "", p->tokens_per_s / r.gpus,
              r.tokens_per_s_per_gpu, 100 * err);
  return {err, p->params};
}

constexpr MptRun kMptH100[] = {
    {"7b", 2048, 8, 6, 1, false, 10643, 6658859008},  // the H100 calibration point (cluster.cpp)
    {"70b", 2048, 64, 8, 4, true, 1039, 64862437376},  {"70b", 2048, 32, 2, 16, true, 882, 64862437376},
    {"30b", 2048, 32, 14, 3, true, 2308, 29975214080}, {"30b", 2048, 8, 3, 21, true, 2002, 29975214080},
    {"13b", 4096, 8, 10, 3, true, 4717, 12864440320},  {"13b", 2048, 64, 2, 1, false, 4800, 12853954560},
    {"13b", 2048, 8, 2, 1, false, 4792, 12853954560},  {"7b", 8192, 8, 8, 2, true, 6935, 6684024832},
    {"3b", 2048, 64, 6, 3, false, 22525, 2651837440},  {"1b", 2048, 8, 14, 1, false, 45455, 1315950592},
    {"760m", 2048, 8, 24, 2, false, 63147, 760470528},
};
constexpr MptRun kMptA100[] = {
    {"70b", 2048, 64, 8, 4, true, 410, 64862437376},   {"30b", 2048, 8, 3, 21, true, 916, 29975214080},
    {"13b", 2048, 8, 2, 3, false, 2262, 12853954560},  {"7b", 2048, 8, 6, 2, false, 4641, 6658859008},
    {"3b", 2048, 8, 10, 2, false, 10811, 2651837440},  {"1b", 2048, 8, 14, 4, false, 20513, 1315950592},
    {"350m", 2048, 8, 32, 2, false, 58782, 355985408}, {"125m", 2048, 8, 40, 2, false, 142830, 125311488},
};

// One efficiency per GPU cannot follow every software choice (micro-batch size, recomputation, model size
// change kernel efficiency; none of that is modelled): the held-out rows are reported, and guarded with
// the bands docs/PLANNER.md states.
void check_mpt(const char* gpu, const MptRun* rows, size_t n, double calibration_tolerance) {
  std::vector<double> errors;
  for (size_t i = 0; i < n; ++i) {
    const MptResult r = run_mpt(gpu, rows[i]);
    EXPECT_EQ(r.params, rows[i].params) << rows[i].size << " " << rows[i].seq;  // exact, against NumParams
    errors.push_back(std::fabs(r.error));
    EXPECT_LT(std::fabs(r.error), 0.35) << gpu << " " << rows[i].size;
  }
  if (calibration_tolerance > 0) {
    EXPECT_LT(errors[0], calibration_tolerance);
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  const double median = sorted.size() % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  EXPECT_LT(median, 0.15) << gpu;
  std::printf("[mosaicml %s] median |error| %.1f%% over %zu runs\n", gpu, 100 * median, sorted.size());
}

TEST(ValidationMosaicMl, H100ThroughputAndExactParameterCounts) {
  check_mpt("h100", kMptH100, std::size(kMptH100), 0.02);
}

TEST(ValidationMosaicMl, A100ThroughputAndExactParameterCounts) {
  check_mpt("a100-80gb", kMptA100, std::size(kMptA100), 0);
}

}  // namespace
}  // namespace gantry
