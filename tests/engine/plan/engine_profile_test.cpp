// The planner's engine profiles (engine/plan/engine_profile.h) against Gantry's backends: the gantry-cpu
// allocation table against the real CPU backend's Backend::memory_bytes() for models of several shapes
// (exactly), the gantry-cuda table against the CUDA backend's bytes measured on an H200 (within 5% of the
// older runs, and exactly once the one allocation that changed since is accounted for; to the printed
// digit for the current backend) and against the CUDA backend itself where this machine has a GPU.
// Step time is never asserted here: it is machine-dependent, and its predicted-versus-measured table
// lives in docs/PERF.md.
#include "engine/plan/engine_profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>

#include "engine/core/backend.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/pipeline_schedule.h"
#include "engine/core/parallel/shard_plan.h"
#include "engine/core/parallel/tensor_parallel.h"  // tensor_parallel_stage_table
#include "engine/plan/memory.h"
#include "engine/plan/planner.h"

namespace gantry {
namespace {

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

struct Shape {
  ModelConfig model;
  int micro_batch;
};

// Layers, widths, heads, vocabularies, sequence lengths and micro-batches that differ from each other,
// odd sizes included (a vocabulary of 77, a single head, T not a power of two).
const Shape kCpuShapes[] = {
    {{.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64},
     8},  // assets/configs/tiny.toml
    {{.n_layer = 1, .n_head = 2, .n_embd = 32, .vocab_size = 100, .seq_len = 16}, 1},
    {{.n_layer = 3, .n_head = 6, .n_embd = 96, .vocab_size = 512, .seq_len = 32}, 4},
    {{.n_layer = 4, .n_head = 8, .n_embd = 128, .vocab_size = 1000, .seq_len = 128}, 2},
    {{.n_layer = 2, .n_head = 1, .n_embd = 48, .vocab_size = 77, .seq_len = 40}, 3},
    {{.n_layer = 6, .n_head = 12, .n_embd = 192, .vocab_size = 2048, .seq_len = 64}, 2},
};

TEST(PlanEngineProfile, CpuMemoryIsTheCpuBackendsAllocationExactly) {
  for (const Shape& s : kCpuShapes) {
    const std::string label = "L" + std::to_string(s.model.n_layer) + " d" + std::to_string(s.model.n_embd) +
                              " h" + std::to_string(s.model.n_head) + " V" +
                              std::to_string(s.model.vocab_size) + " T" + std::to_string(s.model.seq_len) +
                              " B" + std::to_string(s.micro_batch);
    std::unique_ptr<Backend> be = backend_cpu_create(s.model, s.micro_batch, 1);
    const uint64_t measured = be->memory_bytes();
    Result<EngineMemory> mem =
        plan_engine_memory(EngineKind::kGantryCpu, plan_model_of(s.model), s.micro_batch);
    ASSERT_TRUE(mem.ok()) << label << ": " << mem.error();
    EXPECT_EQ(mem->backend_bytes, measured) << label;
    EXPECT_EQ(mem->total, measured) << label << ": the CPU backend allocates nothing it does not count";
    // The goal of issue #7 is 5%; the table is exact, so this only restates it in the issue's terms.
    EXPECT_LT(std::fabs(static_cast<double>(mem->total) / static_cast<double>(measured) - 1), 0.05) << label;
    const uint64_t p = be->params().numel();
    EXPECT_EQ(mem->weights, 4 * p) << label;
    EXPECT_EQ(mem->gradients, 4 * p) << label;
    EXPECT_EQ(mem->optimizer, 8 * p) << label;
  }
}

TEST(PlanEngineProfile, PlanEvaluateWithGantryCpuReportsTheBackendsBytes) {
  const Shape& s = kCpuShapes[0];
  std::unique_ptr<Backend> be = backend_cpu_create(s.model, s.micro_batch, 1);
  PlanInput in;
  in.model = plan_model_of(s.model);
  in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, 1);
  in.layout = PlanLayout{.micro_batch = s.micro_batch};
  in.training.global_batch = 16;
  in.engine = EngineKind::kGantryCpu;
  Result<Plan> p = plan_evaluate(in);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_DOUBLE_EQ(p->memory.total(), static_cast<double>(be->memory_bytes()));
  EXPECT_DOUBLE_EQ(p->backend_bytes, static_cast<double>(be->memory_bytes()));
  EXPECT_TRUE(p->fits);
  EXPECT_EQ(p->micro_batches, 2);
  EXPECT_FALSE(p->layout.flash_attention) << "the CPU reference stores the attention probabilities";
  // The step is the CPU model's, not the GPU model's, and is finite.
  EXPECT_DOUBLE_EQ(p->step_s, p->cpu_step.total());
  EXPECT_GT(p->step_s, 0);
  EXPECT_TRUE(std::isfinite(p->tokens_per_s));
  EXPECT_TRUE(std::isfinite(p->mfu));
}

// Measured on one NVIDIA H200, 2026-11-26: `backend_bytes` (CudaBackend::memory_bytes()) printed by
// tests/bench/gpt_bench for GPT-2 124M (12 layers, d 768, 12 heads, vocab 50,304, T 1,024, micro-batch 32)
// and 350M (24 layers, d 1,024, 16 heads, micro-batch 16); docs/PERF.md, CUDA backend log, calls 9-11
// ("memory 12.87 GB / 20.03 GB").
struct CudaMeasured {
  const char* preset;
  int micro_batch;
  uint64_t backend_bytes;
};
constexpr CudaMeasured kH200[] = {{"gpt2-124m", 32, 12865805520ull}, {"gpt2-350m", 16, 20026063440ull}};

TEST(PlanEngineProfile, CudaMemoryIsWithinFivePercentOfTheMeasuredH200Runs) {
  for (const CudaMeasured& r : kH200) {
    const PlanModel m = plan_model_preset(r.preset).value();
    Result<EngineMemory> mem = plan_engine_memory(EngineKind::kGantryCuda, m, r.micro_batch);
    ASSERT_TRUE(mem.ok()) << mem.error();
    const double err = static_cast<double>(mem->backend_bytes) / static_cast<double>(r.backend_bytes) - 1;
    EXPECT_LT(std::fabs(err), 0.05) << r.preset << ": predicted " << mem->backend_bytes << ", measured "
                                    << r.backend_bytes;
    // Exactly, once the measurement's age is accounted for: those runs predate the atomic-dQ attention
    // backward, whose fp32 accumulator (about B·T·NH·HS floats) now sets the size of the one scratch
    // buffer; before it, the largest need was the LayerNorm backward's partials (or another of the
    // deterministic kernels'). Everything else in the table is unchanged since.
    // Since then, too, each AdamW chunk names three offsets instead of one (32 bytes, was 16: ZeRO's shards),
    // and the step's statistics gained one float (the sum of squares ZeRO's ranks add up).
    const CudaScratch sc = plan_cuda_scratch_floats(m, r.micro_batch);
    // (The LayerNorm backward then kept two partial sums per column, dw and db; it now keeps a third.)
    const uint64_t then =
        std::max({sc.layernorm / 3 * 2, sc.bias, sc.attention_deterministic, sc.global_norm});
    // And the classifier's logits chunk (~256 MB of rows) then had its own allocation; it now shares one
    // with the backward's gradient buffers, which at these shapes are the larger.
    uint64_t chunk_bytes = 0, shared_bytes = 0;
    for (const EngineAllocation& a : mem->allocations) {
      if (a.name == "adamw_chunks") chunk_bytes = a.bytes();
      if (a.name == "logits_and_backward_buffers") shared_bytes = a.bytes();
    }
    const uint64_t n = static_cast<uint64_t>(r.micro_batch) * m.seq, c = m.hidden, v = m.vocab;
    const uint64_t logits_then = ((256ull << 20) / (2 * v)) * v * 2;
    EXPECT_EQ(shared_bytes, 10 * n * c * 2) << r.preset;
    // The table now also counts the 8-byte sum of the replica hash (SDC) and a fifth 4-byte statistic
    // (ZeroDeviceState's stats_ holds 3, with norm_ and eval_sum_): 12 bytes it had missed.
    EXPECT_EQ(mem->backend_bytes - 4 * (sc.total() - then) - chunk_bytes / 2 - 4 - 12 + logits_then,
              r.backend_bytes)
        << r.preset;
  }
}

TEST(PlanEngineProfile, CudaMemoryMatchesTheH200RunsOfTheCurrentBackend) {
  // docs/PERF.md, "Issue 19, first session", calls S2-S4 (one H200, 2026-11-26, the classifier's logits chunk
  // sharing the backward buffers' allocation): backend bytes 12,687,068,564 (124M, micro-batch 32) and
  // 19,809,111,188 (350M, micro-batch 16), 11.82 and 18.45 GiB to two decimals; equal means within half of
  // the last digit. (Call 18's backend, before that change, had 12.07 and 18.70 GiB.)
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const struct {
    const char* preset;
    int micro_batch;
    double gib;
  } runs[] = {{"gpt2-124m", 32, 11.82}, {"gpt2-350m", 16, 18.45}};
  for (const auto& r : runs) {
    Result<EngineMemory> mem =
        plan_engine_memory(EngineKind::kGantryCuda, plan_model_preset(r.preset).value(), r.micro_batch);
    ASSERT_TRUE(mem.ok()) << mem.error();
    EXPECT_NEAR(static_cast<double>(mem->backend_bytes) / kGiB, r.gib, 0.005) << r.preset;
  }
}

TEST(PlanEngineProfile, CudaBucketsFollowTheBackendsDtypes) {
  const PlanModel m = plan_model_preset("gpt2-124m").value();
  Result<EngineMemory> mem = plan_engine_memory(EngineKind::kGantryCuda, m, 4);
  ASSERT_TRUE(mem.ok()) << mem.error();
  const uint64_t p = plan_param_counts(m).total;
  EXPECT_EQ(mem->weights, 2 * p);     // bf16 copy
  EXPECT_EQ(mem->gradients, 4 * p);   // fp32
  EXPECT_EQ(mem->optimizer, 12 * p);  // fp32 master, m, v
  // The cuBLASLt workspace is the engine's memory but not in the backend's own count.
  EXPECT_EQ(mem->total - mem->backend_bytes, kCudaMatmulWorkspaceBytes);
  // The classifier's logits chunk shares one allocation with the backward's gradient buffers: never all
  // N x V, and no larger than those buffers or ~256 MiB of rows, whichever is more.
  const uint64_t n = 4ull * m.seq, c = m.hidden;
  bool found = false;
  for (const EngineAllocation& a : mem->allocations) {
    if (a.name == "logits_and_backward_buffers") {
      found = true;
      EXPECT_LT(a.bytes(), n * m.vocab * 2);
      EXPECT_LE(a.bytes(), std::max<uint64_t>(10 * n * c * 2, 256ull << 20));
    }
  }
  EXPECT_TRUE(found);
}

// On a machine with a GPU (and a CUDA build) the table must equal what the CUDA backend allocates now;
// this is what catches a change to backend_cuda.cu or its kernels' scratch that the planner missed.
TEST(PlanEngineProfile, CudaMemoryIsTheCudaBackendsAllocationExactlyWhereAGpuExists) {
  const Shape shapes[] = {
      {{.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64}, 8},
      {{.n_layer = 3, .n_head = 2, .n_embd = 256, .vocab_size = 1000, .seq_len = 100}, 3},
      {{.n_layer = 2, .n_head = 12, .n_embd = 768, .vocab_size = 50304, .seq_len = 1024}, 4},
  };
  for (const Shape& s : shapes) {
    Result<std::unique_ptr<Backend>> be = backend_create("cuda", s.model, s.micro_batch, {.threads = 1});
    if (!be.ok()) GTEST_SKIP() << "no CUDA backend here: " << be.error();
    Result<EngineMemory> mem =
        plan_engine_memory(EngineKind::kGantryCuda, plan_model_of(s.model), s.micro_batch);
    ASSERT_TRUE(mem.ok()) << mem.error();
    EXPECT_EQ(mem->backend_bytes, be.value()->memory_bytes()) << "d " << s.model.n_embd;
  }
}

TEST(PlanEngineProfile, EngineProfilesRefuseWhatTheEngineCannotRun) {
  PlanInput in;
  in.model = plan_model_preset("gpt2-124m").value();
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 1);
  in.layout = PlanLayout{.micro_batch = 4};
  in.training.global_batch = 8;
  in.engine = EngineKind::kGantryCuda;
  ASSERT_TRUE(plan_evaluate(in).ok());

  auto fails = [](PlanInput bad, const std::string& needle) {
    Result<Plan> p = plan_evaluate(bad);
    EXPECT_FALSE(p.ok()) << needle;
    if (!p.ok()) {
      EXPECT_NE(p.error().find(needle), std::string::npos) << p.error();
    }
  };
  // dp (ZeRO 0-3), tp and pp layouts, interleaved ones too, have their tables (issue 17); cp does not.
  PlanInput tp = in;
  tp.cluster.gpus = 2;
  tp.layout.tp = 2;
  EXPECT_TRUE(plan_evaluate(tp).ok());
  PlanInput zero = in;
  zero.cluster.gpus = 2;
  zero.layout.dp = 2;
  zero.layout.zero = 3;
  EXPECT_TRUE(plan_evaluate(zero).ok());
  zero.model.layers = 4;
  zero.cluster.gpus = 4;
  zero.layout.pp = 2;
  for (int z : {2, 3}) {  // a GPU pipeline stage shards at ZeRO 0-3 (here 1F1B)
    zero.layout.zero = z;
    Result<Plan> staged = plan_evaluate(zero);
    ASSERT_TRUE(staged.ok()) << staged.error();
    EXPECT_EQ(staged->stage_memory.size(), 2u);
  }
  PlanInput cp = in;
  cp.cluster.gpus = 2;
  cp.layout.cp = 2;
  fails(cp, "cp and hsdp are not in its table");
  PlanInput vp = in;
  vp.model.layers = 4;
  vp.cluster.gpus = 2;
  vp.layout.pp = 2;
  vp.layout.vp = 2;
  vp.training.global_batch = 16;
  Result<Plan> interleaved = plan_evaluate(vp);
  ASSERT_TRUE(interleaved.ok()) << interleaved.error();
  ASSERT_EQ(interleaved->stage_memory.size(), 2u);
  EXPECT_DOUBLE_EQ(
      interleaved->stage_memory[1].memory.total(),
      static_cast<double>(
          plan_cuda_rank_memory(vp.model, 4, 1, 2, 1, 4, CudaPipeSchedule::kInterleaved, {}, 2)->total));
  vp.training.global_batch = 12;  // 3 micro-batches: interleaving runs them in groups of pp
  fails(vp, "multiple of pp");
  PlanInput recompute = in;
  recompute.layout.recompute = Recompute::kFull;
  fails(recompute, "recompute none");
  PlanInput no_flash = in;
  no_flash.layout.flash_attention = false;
  fails(no_flash, "flash");
  PlanInput head_size = in;
  head_size.model.heads = 16;  // 768 / 16 = 48: no kernel for it
  fails(head_size, "head size");
  PlanInput llama = in;
  llama.model = plan_model_preset("llama3-8b").value();
  fails(llama, "GPT-2");
  PlanInput untied = in;
  untied.model.tied_embeddings = false;
  untied.engine = EngineKind::kGantryCpu;
  fails(untied, "ties");
}

TEST(PlanEngineProfile, GantryCudaUsesTheEnginesDtypesNotTheGenericOnes) {
  PlanInput in;
  in.model = plan_model_preset("gpt2-124m").value();
  in.cluster = plan_cluster_default(plan_gpu_preset("h200").value(), 1);
  in.layout = PlanLayout{.micro_batch = 32};
  in.training.global_batch = 32;
  Result<Plan> generic = plan_evaluate(in);
  in.engine = EngineKind::kGantryCuda;
  Result<Plan> engine = plan_evaluate(in);
  ASSERT_TRUE(generic.ok() && engine.ok());
  // fp32 gradients: AdamW reads 2 more bytes per parameter. The same FLOPs, and the classifier priced as
  // Gantry's runs it (bf16 logits a chunk at a time, its products nearer the peak): less compute time.
  EXPECT_LT(engine->compute_s, generic->compute_s);
  EXPECT_GT(engine->optimizer_s, generic->optimizer_s);
  // No Korthikanti activations, no 1 GiB reserve: the allocation table.
  EXPECT_DOUBLE_EQ(engine->memory.total(),
                   static_cast<double>(plan_engine_memory(EngineKind::kGantryCuda, in.model, 32)->total));
  EXPECT_LT(engine->memory.total(), generic->memory.total());
}

// A plan of GPT-2 preset `model` on `gpus` H200s as engine `e` runs it (Gantry's CUDA backend at the compute
// efficiency measured for it).
Result<Plan> h200_plan(EngineKind e, const char* model, int gpus, PlanLayout layout, int global_batch) {
  PlanInput in;
  in.model = plan_model_preset(model).value();
  in.cluster = plan_cluster_default(plan_gpu_preset("h200").value(), gpus);
  if (e == EngineKind::kGantryCuda)
    in.cluster.gpu.compute_efficiency = plan_engine_compute_efficiency(EngineKind::kGantryCuda, "h200");
  in.layout = layout;
  in.training.global_batch = global_batch;
  in.engine = e;
  return plan_evaluate(in);
}

// A gantry-cuda pipeline runs at the pace of its costliest rank under the backend's partition (blocks split
// by cost, the classifier on the last stage): at 350M on pp 2 that is about half the model's work. It used
// to be priced as 14 blocks (the engine's first stage) and the classifier besides, 58 % of the model, 13 %
// over the step measured on two H200s (docs/PERF.md, call W1).
// The generic engine keeps its own model (an even split, the classifier on top of the last stage's).
TEST(PlanEngineProfile, GantryCudaPipelineRunsAtItsCostliestRanksPace) {
  auto compute = [](EngineKind e, int pp) {
    PlanInput in;
    in.model = plan_model_preset("gpt2-350m").value();
    in.cluster = plan_cluster_default(plan_gpu_preset("h200").value(), pp);
    in.layout = PlanLayout{.pp = pp, .micro_batch = 16};  // 8 micro-batches a step at every pp
    in.training.global_batch = 128;
    in.engine = e;
    Result<Plan> p = plan_evaluate(in);
    EXPECT_TRUE(p.ok()) << p.error();
    return p.ok() ? p->compute_s : 0.0;
  };
  for (int pp : {2, 4}) {
    const double generic = compute(EngineKind::kGeneric, pp) / compute(EngineKind::kGeneric, 1);
    EXPECT_GT(generic, 1.0 / pp + 0.02) << "generic pp " << pp << ": an even split plus the classifier";
    const double cuda = compute(EngineKind::kGantryCuda, pp) / compute(EngineKind::kGantryCuda, 1);
    EXPECT_GT(cuda, 1.0 / pp - 0.02) << "gantry-cuda pp " << pp;
    EXPECT_LT(cuda, 1.0 / pp + 0.02) << "gantry-cuda pp " << pp << ": the costliest rank of a cost split";
  }
}

// A gantry-cuda pipeline is priced as it runs: every rank's program (telemetry/pipeline_program.h), its
// messages placed by its passes' costs as the CUDA stage places them by its measured ones, timed with its
// own chunks' passes (the classifier inside the last stage's backward, ZB-H1's weight pass the blocks'
// weight-gradient products and the classifier's), not by the formula's equal stages and equal thirds. The
// steps: one GPU (calls W1, T10), pp 2 on 2 NVIDIA H200 (calls U3 and V1) and tp 2 x pp 2 on 4 (call U4), 8
// micro-batches a pipeline step, the messages placed by the measured costs. With them placed by units the
// planner priced tp 2 x pp 2's ZB-H1 at 265 ms, 5 % over the 252 ms it runs in now (and the engine took
// 281 ms then, call U4). The efficiency, a micro-batch's fixed cost and the classifier's rate were fitted
// to the one-GPU steps and P1-P2's pipelines. Not here: 124M's ZB-H1 at pp 2, which the planner prices 6.4 %
// under the 250.19 ms it ran in (call V1; docs/PERF.md).
TEST(PlanEngineProfile, GantryCudaPipelinesArePricedAsTheirProgramsRun) {
  struct Case {
    const char* model;
    int micro, gpus, tp, pp, vp;
    Schedule schedule;
    double measured_ms;
  };
  for (const Case& c : {Case{"gpt2-124m", 32, 1, 1, 1, 1, Schedule::k1F1B, 56.27},
                        Case{"gpt2-350m", 16, 1, 1, 1, 1, Schedule::k1F1B, 76.13},
                        Case{"gpt2-350m", 16, 2, 1, 2, 1, Schedule::k1F1B, 335.69},
                        Case{"gpt2-350m", 16, 2, 1, 2, 1, Schedule::kZeroBubbleH1, 329.60},
                        Case{"gpt2-350m", 16, 2, 1, 2, 2, Schedule::kInterleaved, 324.14},
                        Case{"gpt2-124m", 32, 2, 1, 2, 1, Schedule::k1F1B, 255.40},
                        Case{"gpt2-350m", 16, 4, 2, 2, 1, Schedule::k1F1B, 249.37},
                        Case{"gpt2-350m", 16, 4, 2, 2, 1, Schedule::kZeroBubbleH1, 252.29},
                        Case{"gpt2-350m", 16, 4, 2, 2, 2, Schedule::kInterleaved, 230.24}}) {
    Result<Plan> p = h200_plan(
        EngineKind::kGantryCuda, c.model, c.gpus,
        PlanLayout{.tp = c.tp, .pp = c.pp, .vp = c.vp, .schedule = c.schedule, .micro_batch = c.micro},
        c.micro * (c.pp > 1 ? 8 : 1));
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_NEAR(p->step_s * 1e3, c.measured_ms, 0.05 * c.measured_ms)
        << c.model << " tp " << c.tp << " pp " << c.pp << " vp " << c.vp << " " << schedule_name(c.schedule);
    EXPECT_NEAR(p->compute_s + p->bubble_s + p->exposed_comm_s + p->optimizer_s, p->step_s, 1e-12);
  }
  // Held out: one GPU, 8 micro-batches of 350M.
  Result<Plan> p = h200_plan(EngineKind::kGantryCuda, "gpt2-350m", 1, PlanLayout{.micro_batch = 16}, 128);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_NEAR(p->step_s * 1e3, 594.45, 0.05 * 594.45);
}

// One GPU's step at small micro-batches: each micro-batch costs about 1.5 ms besides its FLOPs and bytes
// (docs/PERF.md call T10, one NVIDIA H200). Priced by the efficiency alone, 124M with 8 sequences came out
// 8.4 % under the measured step and with 4 13 % under.
TEST(PlanEngineProfile, GantryCudaMicroBatchPaysAFixedCost) {
  for (const auto& [model, micro, measured_ms] :
       {std::tuple{"gpt2-124m", 8, 15.91}, std::tuple{"gpt2-124m", 4, 9.04},
        std::tuple{"gpt2-350m", 8, 40.29}}) {
    Result<Plan> p = h200_plan(EngineKind::kGantryCuda, model, 1, PlanLayout{.micro_batch = micro}, micro);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_NEAR(p->step_s * 1e3, measured_ms, 0.05 * measured_ms) << model << " micro-batch " << micro;
  }
}

// Tensor parallel on Gantry's CUDA backend (docs/PERF.md call T10; 2 NVIDIA H200, one GPU and tp 2 in each
// run): a tp rank's compute over half of one GPU's grows with its collectives' time and a fixed cost a
// micro-batch. The model before (0.135 ms a layer, 0.6 s per second of collective and 1.1 ms a micro-batch,
// fitted to steps whose row-parallel forward ran in two halves) priced that cost 2.0 and 2.3 ms over at
// 350M, and its steps 8 % over at 8 sequences.
TEST(PlanEngineProfile, GantryCudaTensorParallelPaysPerCollectiveAndPerMicroBatch) {
  auto step = [](EngineKind e, const char* model, int micro, int tp) {
    Result<Plan> p = h200_plan(e, model, tp, PlanLayout{.tp = tp, .micro_batch = micro}, micro);
    EXPECT_TRUE(p.ok()) << p.error();
    return p.ok() ? p.value() : Plan{};
  };
  struct Measured {
    const char* model;
    int micro;
    double tp2_ms, one_gpu_ms, tp_cost_ms;  // the last: tp 2's forward and backward less half one GPU's
  };
  for (const Measured& m :
       {Measured{"gpt2-124m", 32, 42.10, 56.74, 7.01}, Measured{"gpt2-350m", 16, 56.17, 75.70, 8.92},
        Measured{"gpt2-124m", 8, 13.86, 15.91, 3.28}, Measured{"gpt2-350m", 8, 31.05, 40.29, 5.51},
        Measured{"gpt2-124m", 4, 8.92, 9.04, 2.67}}) {
    SCOPED_TRACE(std::string(m.model) + " micro-batch " + std::to_string(m.micro));
    const Plan one = step(EngineKind::kGantryCuda, m.model, m.micro, 1),
               two = step(EngineKind::kGantryCuda, m.model, m.micro, 2);
    EXPECT_NEAR(two.step_s * 1e3, m.tp2_ms, 0.05 * m.tp2_ms);
    EXPECT_NEAR((two.compute_s - one.compute_s / 2) * 1e3, m.tp_cost_ms, 1.0);
    // Where one GPU is faster, the plan says so too.
    EXPECT_EQ(two.step_s > one.step_s, m.tp2_ms > m.one_gpu_ms);
    ASSERT_EQ(two.comm.size(), 1u);
    EXPECT_NE(two.comm[0].pattern.find("costs the products beside it"), std::string::npos)
        << two.comm[0].pattern;
    EXPECT_NEAR(two.exposed_comm_s, two.comm[0].exposed_s, 1e-12);
    const Plan generic = step(EngineKind::kGeneric, m.model, m.micro, 2);
    ASSERT_EQ(generic.comm.size(), 1u);
    EXPECT_EQ(generic.comm[0].pattern.find("costs"), std::string::npos) << generic.comm[0].pattern;
  }
}

// tp 2 x pp 2 on 4 NVIDIA H200 (docs/PERF.md call T7, 350M, 8 micro-batches of 16, 1F1B): the step was
// 4.5 tp 2 micro-batch steps, (m + p - 1) / p of them, so a stage pays its blocks' share of a micro-batch's
// fixed costs, not all of them; charged whole on every stage they priced it 8.6 % over. (Measured with the
// row-parallel forward in two halves, which made tp 2 1.3 % slower at 350M B16, calls T9-T10.)
TEST(PlanEngineProfile, GantryCudaPipelineStagesShareAMicroBatchsFixedCosts) {
  Result<Plan> p =
      h200_plan(EngineKind::kGantryCuda, "gpt2-350m", 4,
                PlanLayout{.tp = 2, .pp = 2, .schedule = Schedule::k1F1B, .micro_batch = 16}, 128);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_NEAR(p->step_s * 1e3, 253.76, 0.05 * 253.76);
}

// AdamW and the gradient norm on the CUDA backend reach about two thirds of the HBM bandwidth: the optimizer
// phase measured 1.155 ms at 124M and 3.23 ms at 350M on one H200 (calls T1, T2), where the byte count at
// the full bandwidth says 0.78 and 2.22.
TEST(PlanEngineProfile, GantryCudaOptimizerIsPricedAsMeasured) {
  for (const auto& [model, measured_ms] : {std::pair{"gpt2-124m", 1.155}, std::pair{"gpt2-350m", 3.23}}) {
    Result<Plan> p = h200_plan(EngineKind::kGantryCuda, model, 1, PlanLayout{.micro_batch = 8}, 8);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_NEAR(p->optimizer_s * 1e3, measured_ms, 0.05 * measured_ms) << model;
  }
}

TEST(PlanEngineProfile, CpuWorkCountsTheBackendsLoops) {
  // assets/configs/tiny.toml by hand: L 2, d 64, 4 heads (hs 16), V 256, T 64, micro-batch 8 (N 512).
  const PlanModel m =
      plan_model_of({.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  const CpuWork w = plan_cpu_work(m, 8);
  EXPECT_DOUBLE_EQ(w.dot_flops, 2.0 * 2 * 512 * 64 * (12 * 64) + 2.0 * 512 * 64 * 256);
  EXPECT_DOUBLE_EQ(w.axpy_flops, 2 * w.dot_flops);
  EXPECT_DOUBLE_EQ(w.attention_flops, 2.0 * 12 * 16 * (8.0 * 4 * 64 * 65 / 2));
  EXPECT_DOUBLE_EQ(w.gelu_elements, 2.0 * 512 * 256);
  EXPECT_DOUBLE_EQ(w.layernorm_elements, 5.0 * 512 * 64);
  EXPECT_DOUBLE_EQ(w.softmax_elements, 512.0 * 256);
  EXPECT_DOUBLE_EQ(w.params, 120576);

  // Micro-batches repeat the forward and backward, not the optimizer.
  CpuRates r{.dot_flops = 1e9,
             .axpy_flops = 5e8,
             .attention_flops = 4e8,
             .gelu_elements = 3e7,
             .layernorm_elements = 2e8,
             .softmax_elements = 3e8,
             .optimizer_params = 1e8,
             .parallel_for_s = 1e-5};
  const CpuStep one = plan_cpu_step(w, r, 1), two = plan_cpu_step(w, r, 2);
  EXPECT_DOUBLE_EQ(two.matmul_s, 2 * one.matmul_s);
  EXPECT_DOUBLE_EQ(two.optimizer_s, one.optimizer_s);
  EXPECT_DOUBLE_EQ(one.matmul_s, w.dot_flops / 1e9 + w.axpy_flops / 5e8);
  // backend_cpu.cpp's parallel loops: 14 a layer + 5 per micro-batch; AdamW's 28 tensors + the norm a step.
  EXPECT_DOUBLE_EQ(w.parallel_calls, 14 * 2 + 5);
  EXPECT_DOUBLE_EQ(w.optimizer_parallel_calls, 2 + 12 * 2 + 2 + 1);
  EXPECT_DOUBLE_EQ(two.dispatch_s - one.dispatch_s, w.parallel_calls * 1e-5);
  r.gelu_elements = 0;
  EXPECT_FALSE(plan_cpu_rates_validate(r).ok());
  EXPECT_TRUE(plan_cpu_rates_validate(plan_cpu_rates_default()).ok()) << "the developer VM's rates are set";
}

// ---- The CPU backend's layouts (issue 17): pipeline stages, tp collectives, the host's cores.

TEST(PlanEngineProfile, CpuPipelinePartitionIsTheEngines) {
  for (const Shape& s : kCpuShapes) {
    const PlanModel m = plan_model_of(s.model);
    for (int stages = 1; stages <= s.model.n_layer; ++stages) {
      const PipelinePartition want = pipeline_partition(s.model, stages);
      EXPECT_EQ(plan_cpu_pipeline_layers(m, stages), want.layers)
          << s.model.n_layer << " layers, d " << s.model.n_embd << ", " << stages << " stages";
    }
  }
}

TEST(PlanEngineProfile, CpuStagesAddUpToTheWholeModel) {
  const PlanModel m =
      plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  const CpuWork whole = plan_cpu_work(m, 4, 2);
  CpuWork sum;
  const std::vector<int> layers = plan_cpu_pipeline_layers(m, 3);
  for (int s = 0; s < 3; ++s) {
    const CpuWork w = plan_cpu_stage_work(m, 4, 2, layers[s], s == 0, s == 2);
    sum.dot_flops += w.dot_flops, sum.axpy_flops += w.axpy_flops, sum.params += w.params;
    sum.attention_flops += w.attention_flops, sum.layernorm_elements += w.layernorm_elements;
    sum.softmax_elements += w.softmax_elements, sum.parallel_calls += w.parallel_calls;
  }
  EXPECT_DOUBLE_EQ(sum.dot_flops, whole.dot_flops);
  EXPECT_DOUBLE_EQ(sum.axpy_flops + plan_cpu_classifier_wgrad_flops(m, 4, 2), whole.axpy_flops);
  EXPECT_DOUBLE_EQ(sum.params, whole.params);
  EXPECT_DOUBLE_EQ(sum.attention_flops, whole.attention_flops);
  EXPECT_DOUBLE_EQ(sum.layernorm_elements, whole.layernorm_elements);
  EXPECT_DOUBLE_EQ(sum.softmax_elements, whole.softmax_elements);
  EXPECT_DOUBLE_EQ(sum.parallel_calls, whole.parallel_calls);
}

Result<Plan> cpu_plan(int gpus, PlanLayout layout, int cores, int global_batch = 16) {
  PlanInput in;
  in.model = plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, gpus, gpus);
  in.layout = layout;
  in.training.global_batch = global_batch;
  in.engine = EngineKind::kGantryCpu;
  in.cpu = plan_cpu_rates_default(1);
  in.cpu_cores = cores;
  return plan_evaluate(in);
}

TEST(PlanEngineProfile, CpuRanksShareTheHostsCores) {
  // dp 4 with a core each: a quarter of the batch per rank. On 2 cores the four ranks' work queues for
  // them: about twice as long, never less than the host's work over its cores.
  Result<Plan> own = cpu_plan(4, PlanLayout{.micro_batch = 4}, 4);
  Result<Plan> shared = cpu_plan(4, PlanLayout{.micro_batch = 4}, 2);
  ASSERT_TRUE(own.ok() && shared.ok()) << own.error() << shared.error();
  EXPECT_DOUBLE_EQ(own->cpu_share, 1);
  EXPECT_DOUBLE_EQ(shared->cpu_share, 2);
  const double work = own->cpu_step.total();
  EXPECT_GE(shared->step_s, 2 * work);
  EXPECT_GT(shared->step_s, own->step_s);
  // One rank alone: the cores it does not use change nothing.
  Result<Plan> one = cpu_plan(1, PlanLayout{.micro_batch = 4}, 2),
               one8 = cpu_plan(1, PlanLayout{.micro_batch = 4}, 8);
  ASSERT_TRUE(one.ok() && one8.ok());
  EXPECT_DOUBLE_EQ(one->step_s, one8->step_s);
  EXPECT_DOUBLE_EQ(one->step_s, one->cpu_step.total());
  // Other work on the host: one busy thread beside one rank on 2 cores leaves it a core; three leave it half
  // of one (the kernel's fair share), so the same work takes twice as long.
  PlanInput in;
  in.model = plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, 1, 1);
  in.layout = PlanLayout{.micro_batch = 4};
  in.training.global_batch = 16;
  in.engine = EngineKind::kGantryCpu;
  in.cpu = plan_cpu_rates_default(1);
  in.cpu_cores = 2;
  in.cpu_background = 1;
  Result<Plan> quiet = plan_evaluate(in);
  in.cpu_background = 3;
  Result<Plan> busy = plan_evaluate(in);
  ASSERT_TRUE(quiet.ok() && busy.ok());
  EXPECT_DOUBLE_EQ(quiet->step_s, one->step_s);
  EXPECT_NEAR(busy->step_s, 2 * one->step_s, 1e-12);
  EXPECT_DOUBLE_EQ(busy->cpu_share, 2);
  in.cpu_background = -1;
  Result<Plan> bad = plan_evaluate(in);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("cpu_background"), std::string::npos) << bad.error();
}

// Issue 17: ranks that outnumber the cores. The work takes longer by the runnable threads over the cores,
// and never while the cores are enough: the same layout on more cores is not oversubscribed.
TEST(PlanEngineProfile, CpuOversubscriptionIsOneWithACorePerRankAndGrowsWithRanksPerCore) {
  for (int cores : {4, 8, 64}) {
    Result<Plan> p = cpu_plan(4, PlanLayout{.tp = 4, .micro_batch = 8}, cores);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_DOUBLE_EQ(p->cpu_oversubscription, 1) << cores << " cores";
  }
  Result<Plan> two = cpu_plan(4, PlanLayout{.tp = 4, .micro_batch = 8}, 2),
               one = cpu_plan(4, PlanLayout{.tp = 4, .micro_batch = 8}, 1),
               own = cpu_plan(4, PlanLayout{.tp = 4, .micro_batch = 8}, 4);
  ASSERT_TRUE(two.ok() && one.ok() && own.ok());
  EXPECT_DOUBLE_EQ(two->cpu_oversubscription, 2);
  EXPECT_DOUBLE_EQ(one->cpu_oversubscription, 4);
  EXPECT_GT(two->step_s, own->step_s);
  EXPECT_GT(one->step_s, two->step_s);
}

// Each blocking collective the layout issues costs the host CPU (the kernel's loopback TCP work, Gloo's
// thread) by its ring steps and bytes: counted per collective, it lengthens the step of ranks that share
// cores, and with a core per rank it is inside the waits (no longer a step than the waits themselves).
TEST(PlanEngineProfile, CpuCollectivesCostHostCpuPerCollectiveTheLayoutIssues) {
  auto plan = [](PlanLayout layout, int gpus, int cores, double step_cpu) {
    PlanInput in;
    in.model = plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
    in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, gpus, gpus);
    in.layout = layout;
    in.training.global_batch = 16;
    in.engine = EngineKind::kGantryCpu;
    in.cpu = plan_cpu_rates_default(1);
    in.cpu.comm_cpu_step_s = step_cpu;
    in.cpu.comm_cpu_byte_s = 0;
    in.cpu_cores = cores;
    return plan_evaluate(in);
  };
  // tp 2, m 2: per micro-batch 1 + 4·4 + 1 all-reduces and the cross-entropy's 2 all-gathers, and the
  // loss's all-reduce once a step: 41 collectives, each 2 ring steps (all-reduce) or 1 (all-gather).
  Result<Plan> none = plan(PlanLayout{.tp = 2, .micro_batch = 8}, 2, 1, 0),
               some = plan(PlanLayout{.tp = 2, .micro_batch = 8}, 2, 1, 1e-3);
  ASSERT_TRUE(none.ok() && some.ok()) << none.error() << some.error();
  EXPECT_DOUBLE_EQ(some->cpu_collectives, 41);
  const double ring_steps = 2 * (18 * 2 + 2 * 1) + 2;  // m·(18 all-reduces + 2 gathers) + the loss's
  EXPECT_NEAR(some->cpu_comm_cpu_s, 2 /*ranks*/ * ring_steps * 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(none->cpu_comm_cpu_s, 0);
  // The host's CPU a step is the ranks' work and their collectives'.
  EXPECT_NEAR(some->cpu_host_cpu_s - none->cpu_host_cpu_s, some->cpu_comm_cpu_s, 1e-12);
  // Two ranks on one core: every rank's collective CPU is the host's, shared by both.
  EXPECT_GT(some->step_s, none->step_s);
  // dp 2 issues fewer collectives (the gradients' bucket and the loss): less of it.
  Result<Plan> dp = plan(PlanLayout{.micro_batch = 8}, 2, 1, 1e-3);
  ASSERT_TRUE(dp.ok()) << dp.error();
  EXPECT_DOUBLE_EQ(dp->cpu_collectives, 2);
  EXPECT_LT(dp->cpu_comm_cpu_s, some->cpu_comm_cpu_s);
  // One rank has no collective: nothing.
  Result<Plan> alone = plan(PlanLayout{.micro_batch = 8}, 1, 1, 1e-3);
  ASSERT_TRUE(alone.ok());
  EXPECT_DOUBLE_EQ(alone->cpu_collectives, 0);
  EXPECT_DOUBLE_EQ(alone->cpu_comm_cpu_s, 0);
  // A core per rank: the CPU is spent inside the waits the step already has.
  Result<Plan> own_none = plan(PlanLayout{.tp = 2, .micro_batch = 8}, 2, 2, 0),
               own_some = plan(PlanLayout{.tp = 2, .micro_batch = 8}, 2, 2, 1e-5);
  ASSERT_TRUE(own_none.ok() && own_some.ok());
  EXPECT_DOUBLE_EQ(own_some->step_s, own_none->step_s);
  // Bad rates are refused by name.
  Result<Plan> bad = plan(PlanLayout{.tp = 2, .micro_batch = 8}, 2, 2, -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("comm_cpu_step_s"), std::string::npos) << bad.error();
}

TEST(PlanEngineProfile, CpuTensorParallelWaitsForItsGlooCollectives) {
  Result<Plan> tp2 = cpu_plan(2, PlanLayout{.tp = 2, .micro_batch = 8}, 2);
  ASSERT_TRUE(tp2.ok()) << tp2.error();
  ASSERT_EQ(tp2->comm.size(), 1u);
  const CommAxis& a = tp2->comm[0];
  EXPECT_EQ(a.axis, "tp");
  // (N, C) fp32 all-reduces: the embedding, 4 per block, the final norm's input gradient; the
  // cross-entropy's all-gathers of N and 3N floats per rank; 2 micro-batches.
  EXPECT_DOUBLE_EQ(a.bytes, 2 * ((1 + 4 * 4 + 1) * 4.0 * 8 * 64 * 64 + 4.0 * 4 * 512 * 2));
  EXPECT_GT(a.seconds, 0);
  EXPECT_DOUBLE_EQ(a.exposed_s, a.seconds) << "the CPU backend blocks on every collective";
  EXPECT_GT(tp2->step_s, tp2->cpu_step.total()) << "its waits are on top of the compute";
  // The CPU backend cannot overlap: asking for it is refused by name.
  PlanInput in;
  in.model = plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  in.cluster = plan_cluster_default(GpuSpec{.name = "cpu", .hbm_bytes = 24e9}, 2, 2);
  in.layout = PlanLayout{.tp = 2, .micro_batch = 8};
  in.training.global_batch = 16;
  in.training.tp_overlap = 0.5;
  in.engine = EngineKind::kGantryCpu;
  Result<Plan> refused = plan_evaluate(in);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("tp_overlap"), std::string::npos) << refused.error();
}

// The dp axis as ZeroHostState runs it (one bucket here: the model is 0.9 MB of gradients): ZeRO 0 one
// all-reduce a step; 1 a reduce-scatter and an all-gather (the same ring bytes); 2 a reduce-scatter every
// micro-batch; 3 that and every block's parameters gathered twice a micro-batch, the ends once a step. They
// used to be priced as ZeRO 0's all-reduce at every stage.
TEST(PlanEngineProfile, CpuDataParallelCollectivesFollowTheZeroStage) {
  auto dp_axis = [](int zero) {
    Result<Plan> p = cpu_plan(2, PlanLayout{.dp = 2, .zero = zero, .micro_batch = 2}, 2, 16);  // m 4
    EXPECT_TRUE(p.ok()) << p.error();
    CommAxis dp;
    for (const CommAxis& a : p->comm) {
      if (a.axis == "dp") dp = a;
    }
    EXPECT_EQ(dp.axis, "dp") << "zero " << zero;
    return std::make_pair(dp, p->cpu_collectives);
  };
  const auto [z0, n0] = dp_axis(0);
  const auto [z1, n1] = dp_axis(1);
  const auto [z2, n2] = dp_axis(2);
  const auto [z3, n3] = dp_axis(3);
  const double loss = 1;  // the loss's reduction over dp, once a step
  EXPECT_DOUBLE_EQ(n0, 1 + loss);
  EXPECT_DOUBLE_EQ(n1, 2 + loss);
  EXPECT_DOUBLE_EQ(n2, 4 + 1 + loss);
  EXPECT_DOUBLE_EQ(n3, 4 + 2 * 4 * 4 + 1 + loss);  // m reduce-scatters, 2·m·L block gathers, the ends
  EXPECT_NEAR(z1.seconds, z0.seconds, 1e-12 * z0.seconds) << "reduce-scatter + all-gather = all-reduce";
  EXPECT_GT(z2.seconds, z1.seconds);
  EXPECT_GT(z3.seconds, z2.seconds);
  EXPECT_NE(z3.pattern.find("each block's parameters"), std::string::npos) << z3.pattern;
}

TEST(PlanEngineProfile, CpuPipelineHasItsBubbleAndInterleavedStagesTheirMemory) {
  // pp 2, a core each: the fill and drain cost (p − 1) stage-times, which more micro-batches amortise.
  Result<Plan> m4 = cpu_plan(2, PlanLayout{.pp = 2, .micro_batch = 4}, 2, 16);
  Result<Plan> m8 = cpu_plan(2, PlanLayout{.pp = 2, .micro_batch = 2}, 2, 16);
  ASSERT_TRUE(m4.ok() && m8.ok()) << m4.error() << m8.error();
  EXPECT_EQ(m4->micro_batches, 4);
  EXPECT_EQ(m8->micro_batches, 8);
  EXPECT_GT(m4->bubble_s, 0);
  EXPECT_LT(m8->bubble_s / m8->step_s, m4->bubble_s / m4->step_s);
  // The pipeline is faster than one rank doing it all, slower than half of it.
  Result<Plan> one = cpu_plan(1, PlanLayout{.micro_batch = 4}, 2, 16);
  ASSERT_TRUE(one.ok());
  EXPECT_LT(m4->step_s, one->step_s);
  EXPECT_GT(m4->step_s, one->step_s / 2);
  // Interleaving (v 2, 4 stages' worth of chunks on 2 ranks) shrinks the bubble.
  Result<Plan> v2 = cpu_plan(2, PlanLayout{.pp = 2, .vp = 2, .micro_batch = 4}, 2, 16);
  ASSERT_TRUE(v2.ok()) << v2.error();
  EXPECT_LT(v2->bubble_s, m4->bubble_s);
  // Every rank's table, interleaved ones too: each rank's figure is plan_cpu_pipeline_memory's for its
  // chunks (virtual stages r and r + 2 of 4, one block each; m 4: each rank holds [4, 2] slots), the
  // heaviest the plan's.
  const PlanModel model =
      plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  ASSERT_EQ(v2->stage_memory.size(), 2u);
  double heaviest = 0;
  for (int r = 0; r < 2; ++r) {
    Result<EngineMemory> e =
        plan_cpu_pipeline_memory(model, 4, 1, 2, r, 4, CudaPipeSchedule::kInterleaved, {}, 2);
    ASSERT_TRUE(e.ok()) << e.error();
    const Plan::StageMemory& sm = v2->stage_memory[static_cast<size_t>(r)];
    EXPECT_DOUBLE_EQ(sm.memory.total(), static_cast<double>(e->total)) << r;
    EXPECT_EQ(sm.layers, 2) << r;
    EXPECT_DOUBLE_EQ(sm.microbatches_in_flight, 3.0) << "the chunks' slots, by their blocks";
    heaviest = std::max(heaviest, sm.memory.total());
  }
  EXPECT_DOUBLE_EQ(v2->memory.total(), heaviest);
  ASSERT_EQ(m4->comm.size(), 1u);
  EXPECT_EQ(m4->comm[0].axis, "pp");
}

TEST(PlanEngineProfile, CpuPipelineStagesHoldTheirSlotsTiesAndCopies) {
  // 4 layers (d 64, V 256, T 64), micro-batch 4 (N 256), m 4, pp 4: one block a stage.
  const PlanModel m =
      plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  const double n = 256, c = 64, v = 256;
  const double block = n * c * 4 + n * c + n * 4 + n * 3 * c + 4.0 * 4 * 64 * 64 + n * 4 * c * 2;
  const double slot = 4 * (2 * n * c + block), head = 4 * (n * c + 2 * n + n * v + n);
  std::vector<uint64_t> one_f_one_b, gpipe;
  for (int s = 0; s < 4; ++s) {
    one_f_one_b.push_back(plan_cpu_pipeline_memory(m, 4, 1, 4, s, 4, false)->total);
    gpipe.push_back(plan_cpu_pipeline_memory(m, 4, 1, 4, s, 4, true)->total);
  }
  // 1F1B: stage 0 holds min(m, p) slots, stage s > 0 min(m, p − s + 1); GPipe every micro-batch's.
  EXPECT_DOUBLE_EQ(static_cast<double>(gpipe[1] - one_f_one_b[1]), 0);
  EXPECT_DOUBLE_EQ(static_cast<double>(gpipe[2] - one_f_one_b[2]), slot);
  EXPECT_DOUBLE_EQ(static_cast<double>(gpipe[3] - one_f_one_b[3]), 2 * (slot + head));
  // The last stage's copy of wte and its ties, the first stage's embeddings and d(embedding)s.
  Result<EngineMemory> last = plan_cpu_pipeline_memory(m, 4, 1, 4, 3, 4, false);
  ASSERT_TRUE(last.ok());
  auto row = [](const EngineMemory& e, const std::string& name) {
    for (const EngineAllocation& a : e.allocations)
      if (a.name == name) return a.bytes();
    return uint64_t{0};
  };
  EXPECT_EQ(row(last.value(), "wte_copy"), 4 * 256 * 64u);
  EXPECT_EQ(row(last.value(), "tie"), 4 * 4 * (256 * 64 + 256 * 256u));
  EXPECT_EQ(row(plan_cpu_pipeline_memory(m, 4, 1, 4, 0, 4, false).value(), "dres0"), 4 * 4 * 256 * 64u);
  // The first stage receives one micro-batch's tie at a time into one buffer (backend_cpu_pipeline.cpp's
  // tie_buffer); the other stages have none.
  EXPECT_EQ(row(plan_cpu_pipeline_memory(m, 4, 1, 4, 0, 4, false).value(), "tie_in"),
            4 * (256 * 64 + 256 * 256u));
  EXPECT_EQ(row(plan_cpu_pipeline_memory(m, 4, 1, 4, 1, 4, false).value(), "tie_in"), 0u);
  EXPECT_FALSE(plan_cpu_pipeline_memory(m, 4, 1, 4, 4, 4, false).ok()) << "no stage 4 of 4";
}

// ---- The CUDA backend's ranks at tp x pp (issue 17).

// The slots plan_pipeline_slots' closed forms count are the backends' acquire()'s: the rank's program
// replayed with their rules (plan_pipeline_chunk_slots; tests/app/plan_cli_test.cpp compares its tables with
// real ranks).
int replayed_slots(CudaPipeSchedule s, int pp, int stage, int m) {
  Result<std::vector<int>> slots = plan_pipeline_chunk_slots(pp, 1, stage, m, s);
  EXPECT_TRUE(slots.ok()) << slots.error();
  return slots.ok() ? slots.value()[0] : -1;
}

TEST(PlanEngineProfile, PipelineSlotsAreWhatTheStagesProgramsHold) {
  for (int pp = 2; pp <= 4; ++pp) {
    for (int m = 1; m <= 9; ++m) {
      for (int stage = 0; stage < pp; ++stage) {
        EXPECT_EQ(plan_pipeline_slots(pp, stage, m, false),
                  replayed_slots(CudaPipeSchedule::kOneFOneB, pp, stage, m))
            << "1f1b pp " << pp << " m " << m << " stage " << stage;
        EXPECT_EQ(plan_pipeline_slots(pp, stage, m, true),
                  replayed_slots(CudaPipeSchedule::kGpipe, pp, stage, m))
            << "gpipe pp " << pp << " m " << m << " stage " << stage;
      }
    }
  }
}

// ZB-H1 on the GPU frees a slot after the weight pass: the closed form plan_cuda_pipeline_slots uses is the
// replayed program's on every stage of pp 2-8 for m up to 4 pp (and GPipe, 1F1B are plan_pipeline_slots').
TEST(PlanEngineProfile, CudaZbh1SlotsAreWhatTheStagesProgramsHold) {
  for (int pp = 2; pp <= 8; ++pp) {
    for (int m = 1; m <= 4 * pp; ++m) {
      for (int stage = 0; stage < pp; ++stage) {
        EXPECT_EQ(plan_cuda_pipeline_slots(pp, stage, m, CudaPipeSchedule::kZeroBubbleH1),
                  replayed_slots(CudaPipeSchedule::kZeroBubbleH1, pp, stage, m))
            << "zbh1 pp " << pp << " m " << m << " stage " << stage;
        EXPECT_EQ(plan_cuda_pipeline_slots(pp, stage, m, CudaPipeSchedule::kOneFOneB),
                  plan_pipeline_slots(pp, stage, m, false));
        EXPECT_EQ(plan_cuda_pipeline_slots(pp, stage, m, CudaPipeSchedule::kGpipe), m);
      }
    }
  }
}

const ModelConfig kTpPpModels[] = {
    {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64},  // tiny.toml
    {.n_layer = 5, .n_head = 4, .n_embd = 128, .vocab_size = 1000, .seq_len = 32},
    {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50304, .seq_len = 1024},  // GPT-2 124M
};

// The CUDA stage partition is the backend's (ClassifierGradStage::kLast), not the CPU pipeline's.
TEST(PlanEngineProfile, CudaPipelinePartitionIsTheBackends) {
  for (const ModelConfig& mc : kTpPpModels) {
    for (int pp = 1; pp <= std::min(4, mc.n_layer); ++pp) {
      EXPECT_EQ(plan_cuda_pipeline_layers(plan_model_of(mc), pp),
                pipeline_partition(mc, pp, ClassifierGradStage::kLast).layers)
          << "L " << mc.n_layer << " pp " << pp;
      EXPECT_EQ(plan_cpu_pipeline_layers(plan_model_of(mc), pp),
                pipeline_partition(mc, pp, ClassifierGradStage::kFirst).layers)
          << "L " << mc.n_layer << " pp " << pp;
    }
  }
}

uint64_t row_bytes(const EngineMemory& e, const std::string& name) {
  uint64_t b = 0;
  for (const EngineAllocation& a : e.allocations) {
    if (a.name == name) b += a.bytes();
  }
  return b;
}

// Interleaved, each of a rank's chunks has its own pool of slots: the replayed program's counts, which have
// no simple closed form (the last rank holds fewer: its chunks' backwards come first), and a shape the
// schedule cannot run is refused by name.
TEST(PlanEngineProfile, InterleavedChunksHoldTheirReplayedSlots) {
  auto slots = [](int pp, int vp, int stage, int m) {
    return plan_pipeline_chunk_slots(pp, vp, stage, m, CudaPipeSchedule::kInterleaved).value();
  };
  for (int stage = 0; stage < 3; ++stage) EXPECT_EQ(slots(4, 2, stage, 8), (std::vector<int>{8, 4})) << stage;
  EXPECT_EQ(slots(4, 2, 3, 8), (std::vector<int>{6, 3}));
  EXPECT_EQ(slots(3, 3, 0, 6), (std::vector<int>{6, 5, 3}));
  EXPECT_EQ(slots(3, 3, 1, 6), (std::vector<int>{6, 4, 3}));
  EXPECT_EQ(slots(3, 3, 2, 6), (std::vector<int>{6, 3, 3}));
  Result<std::vector<int>> odd = plan_pipeline_chunk_slots(4, 2, 0, 6, CudaPipeSchedule::kInterleaved);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().find("multiple of pp"), std::string::npos) << odd.error();
  Result<std::vector<int>> one_chunk = plan_pipeline_chunk_slots(4, 1, 0, 8, CudaPipeSchedule::kInterleaved);
  ASSERT_FALSE(one_chunk.ok());
  EXPECT_NE(one_chunk.error().find("vp > 1 with interleaved"), std::string::npos) << one_chunk.error();
  EXPECT_FALSE(plan_pipeline_chunk_slots(4, 2, 0, 8, CudaPipeSchedule::kOneFOneB).ok());
  EXPECT_FALSE(plan_pipeline_chunk_slots(4, 2, 4, 8, CudaPipeSchedule::kInterleaved).ok())
      << "no rank 4 of 4";
}

// A rank's table holds each chunk's slots sized by that chunk's own blocks (6 layers over pp 2 x vp 2: the
// engine's partition gives the chunks of a rank different block counts), its state the rank's tensors
// (pipeline_rank_table over its chunks), on both backends; the model's last chunk's slots also hold the head.
TEST(PlanEngineProfile, InterleavedChunksSlotsAreSizedByTheirOwnBlocks) {
  const ModelConfig mc{.n_layer = 6, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64};
  const PlanModel m = plan_model_of(mc);
  const uint64_t n = 4 * 64, c = 64, v = 256;
  for (bool cuda : {false, true}) {
    const PipelinePartition part =
        pipeline_partition(mc, 4, cuda ? ClassifierGradStage::kLast : ClassifierGradStage::kFirst);
    // Bytes of one block's activations in a slot: the CPU's fp32 (with the (B, NH, T, T) probabilities),
    // the GPU's bf16 (five (N, C), qkv, two (N, 4C)) and fp32 statistics (four (N), the (B, NH, T) lse).
    const uint64_t block =
        cuda ? n * c * 2 * 5 + n * 4 * 4 + n * 3 * c * 2 + 4 * 4 * 64 * 4 + n * 4 * c * 2 * 2
             : 4 * (n * c * 4 + n * c + n * 4 + n * 3 * c + 4 * 4 * 64 * 64 + n * 4 * c * 2);
    for (int r = 0; r < 2; ++r) {
      const std::string at = std::string(cuda ? "cuda" : "cpu") + " rank " + std::to_string(r);
      Result<EngineMemory> e =
          cuda ? plan_cuda_rank_memory(m, 4, 1, 2, r, 4, CudaPipeSchedule::kInterleaved, {}, 2)
               : plan_cpu_pipeline_memory(m, 4, 1, 2, r, 4, CudaPipeSchedule::kInterleaved, {}, 2);
      ASSERT_TRUE(e.ok()) << at << ": " << e.error();
      const std::vector<int> held =
          plan_pipeline_chunk_slots(2, 2, r, 4, CudaPipeSchedule::kInterleaved).value();
      std::vector<const EngineAllocation*> rows;
      for (const EngineAllocation& a : e->allocations)
        if (a.name.rfind("slot of chunk ", 0) == 0) rows.push_back(&a);
      ASSERT_EQ(rows.size(), 2u) << at;
      const int l0 = part.layers[static_cast<size_t>(r)], l1 = part.layers[static_cast<size_t>(2 + r)];
      for (size_t k = 0; k < 2; ++k) EXPECT_EQ(rows[k]->count, static_cast<uint64_t>(held[k])) << at;
      // The head (the final norm's output; on the CPU its statistics, logits and losses too) on rank 1's
      // second chunk only.
      const uint64_t head = r == 1 ? (cuda ? n * c * 2 + 2 * n * 4 : 4 * (n * c + 2 * n + n * v + n)) : 0;
      EXPECT_EQ(static_cast<int64_t>(rows[1]->bytes_each) - static_cast<int64_t>(rows[0]->bytes_each),
                (static_cast<int64_t>(l1) - l0) * static_cast<int64_t>(block) + static_cast<int64_t>(head))
          << at << ": chunks of " << l0 << " and " << l1 << " blocks";
      const TensorTable t = pipeline_rank_table(mc, part, 2, r);
      EXPECT_EQ(row_bytes(e.value(), cuda ? "master" : "params"), 4 * t.numel()) << at;
      EXPECT_DOUBLE_EQ(e->in_flight, static_cast<double>(held[0] * l0 + held[1] * l1) / (l0 + l1)) << at;
    }
  }
}

// Each rank's state is its tensor table's (the engine's own pipeline_rank_table cut by
// tensor_parallel_stage_table, as backend_cuda.cu's stage_table): five buffers of its elements, one AdamW
// chunk per 64K elements of each tensor; over the stages at tp 1 the parameters are the whole model's.
TEST(PlanEngineProfile, CudaRankStateIsTheRanksTensorTable) {
  for (const ModelConfig& mc : kTpPpModels) {
    const PlanModel m = plan_model_of(mc);
    for (int tp : {1, 2, 4}) {
      for (int pp = 1; pp <= std::min(4, mc.n_layer); ++pp) {
        const PipelinePartition part = pipeline_partition(mc, pp, ClassifierGradStage::kLast);
        uint64_t params_tp1 = 0;
        for (int stage = 0; stage < pp; ++stage) {
          for (int r = 0; r < tp; ++r) {
            const TensorTable st = pipeline_rank_table(mc, part, pp, stage);
            const TensorTable t = tp > 1 ? tensor_parallel_stage_table(mc, tp, r, st) : st;
            uint64_t chunks = 0;
            for (const TensorInfo& x : t.tensors()) chunks += (x.numel + 65535) / 65536;
            Result<EngineMemory> e = plan_cuda_rank_memory(m, 2, tp, pp, stage, 4, false);
            ASSERT_TRUE(e.ok()) << e.error();
            const std::string at = "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " stage " +
                                   std::to_string(stage) + " L " + std::to_string(mc.n_layer);
            EXPECT_EQ(row_bytes(e.value(), "master"), 4 * t.numel()) << at;
            EXPECT_EQ(row_bytes(e.value(), "params_bf16"), 2 * t.numel()) << at;
            EXPECT_EQ(row_bytes(e.value(), "grads"), 4 * t.numel()) << at;
            EXPECT_EQ(row_bytes(e.value(), "adamw_chunks"), 32 * chunks) << at;
            EXPECT_EQ(row_bytes(e.value(), "chunk_scratch"), tp > 1 || pp > 1 ? 4 * chunks : 0) << at;
            if (tp == 1) params_tp1 += t.numel();
          }
        }
        if (tp == 1) {
          EXPECT_EQ(params_tp1, plan_param_counts(m).total) << "pp " << pp;
        }
      }
    }
  }
}

// Stage 0, the middle stages and the last differ as backend_cuda.cu allocates: the wte copy (bf16) and its
// fp32 gradient on the last stage, the gradient received on stage 0, the classifier's logits only on the
// last, the slots 1F1B holds per stage, the step's tokens per micro-batch; pp 1 is the one-GPU table.
TEST(PlanEngineProfile, CudaStagesHoldTheirSlotsCopiesAndTokens) {
  const PlanModel m = plan_model_preset("gpt2-124m").value();
  const uint64_t v = m.vocab, c = m.hidden, t = m.seq, b = 4, n = b * t;
  for (int tp : {1, 2}) {
    Result<EngineMemory> one = plan_cuda_rank_memory(m, 4, tp, 1, 0, 8, false);
    Result<EngineMemory> eng = plan_engine_memory(EngineKind::kGantryCuda, m, 4, tp);
    ASSERT_TRUE(one.ok() && eng.ok());
    EXPECT_EQ(one->total, eng->total) << "tp " << tp;
    EXPECT_EQ(row_bytes(one.value(), "chunk_scratch") > 0, tp > 1);
    EXPECT_EQ(row_bytes(one.value(), "ce_max, ce_all_max, ce_part, ce_all_part") > 0, tp > 1);
    std::vector<EngineMemory> st;
    for (int s = 0; s < 4; ++s) st.push_back(plan_cuda_rank_memory(m, 4, tp, 4, s, 8, false).value());
    const uint64_t vl = v / static_cast<uint64_t>(tp);
    EXPECT_EQ(row_bytes(st[0], "dwte_in"), vl * c * 4);
    EXPECT_EQ(row_bytes(st[0], "wte_copy") + row_bytes(st[0], "dwte"), 0u);
    EXPECT_EQ(row_bytes(st[3], "wte_copy"), vl * c * 2);
    EXPECT_EQ(row_bytes(st[3], "dwte"), vl * c * 4);
    EXPECT_EQ(row_bytes(st[3], "dwte_in"), 0u);
    for (int s : {1, 2}) {
      EXPECT_EQ(row_bytes(st[static_cast<size_t>(s)], "wte_copy") +
                    row_bytes(st[static_cast<size_t>(s)], "dwte") +
                    row_bytes(st[static_cast<size_t>(s)], "dwte_in"),
                0u);
    }
    // 1F1B at pp 4, m 8: 4, 4, 3, 2 slots; a slot is (in, dout) and the stage's blocks, the last's lnf too.
    const uint64_t slots[] = {4, 4, 3, 2};
    for (size_t s = 0; s < 4; ++s) {
      bool found = false;
      for (const EngineAllocation& a : st[s].allocations) {
        if (a.name.rfind("slot", 0) == 0) {
          found = true;
          EXPECT_EQ(a.count, slots[s]) << "stage " << s;
        }
      }
      EXPECT_TRUE(found);
      EXPECT_EQ(row_bytes(st[s], "tokens"), 8 * (5 * n + 1) * 4) << "stage " << s;
    }
    // Only the last stage runs the classifier: its shared region holds at least ~256 MB of V/tp logits
    // columns; the others' is the backward's buffers alone.
    const std::string region = "logits_and_backward_buffers";
    EXPECT_EQ(row_bytes(st[0], region), row_bytes(st[1], region));
    EXPECT_GE(row_bytes(st[3], region), std::min<uint64_t>(n, (256ull << 20) / (vl * 2)) * vl * 2);
    EXPECT_EQ(row_bytes(st[0], region), (3 * n * c + 4 * n * c + 3 * n * c) * 2);
    // GPipe holds every micro-batch on every stage: more than 1F1B wherever 1F1B holds fewer than 8.
    for (int s = 0; s < 4; ++s) {
      EXPECT_GT(plan_cuda_rank_memory(m, 4, tp, 4, s, 8, true)->total, st[static_cast<size_t>(s)].total);
    }
  }
  // The tp ranks split the wte and the blocks' matrices: a tp 2 rank's state is more than half and less than
  // all of tp 1's (LayerNorms, positions and the row-parallel biases are whole on each).
  const uint64_t whole = row_bytes(plan_cuda_rank_memory(m, 4, 1, 2, 0, 2, false).value(), "grads");
  const uint64_t half = row_bytes(plan_cuda_rank_memory(m, 4, 2, 2, 0, 2, false).value(), "grads");
  EXPECT_GT(2 * half, whole);
  EXPECT_LT(half, whole);
}

// Sequence parallelism on the CUDA backend (tp > 1, pp 1): the residual stream's res2 and res3 at N/tp rows,
// and ZeroDeviceState's packed partial gradients (the LayerNorms and the row-parallel biases, every whole
// tensor but wpe) with their two run lists, exactly ShardPlan::gradient_runs of the rank's table at every
// dp rank, ZeRO stage and bucket size; nothing else changes. At pp > 1 (refused by the backend) the table is
// the one without it.
TEST(PlanEngineProfile, CudaSequenceParallelHoldsTheResidualStreamSplitAndThePackedPartialGradients) {
  for (const ModelConfig& mc : kTpPpModels) {
    const PlanModel m = plan_model_of(mc);
    const uint64_t micro = 2, n = micro * mc.seq_len, c = mc.n_embd, l = mc.n_layer;
    for (int tp : {2, 4}) {
      const TensorTable t = tensor_parallel_table(mc, tp, 0);
      std::vector<bool> partial;
      for (const TensorInfo& x : t.tensors())
        partial.push_back(!tensor_parallel_sharded(x.name) && x.name != "wpe");
      for (int dp : {1, 2, 3}) {
        for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
          for (uint64_t bucket : {uint64_t{50} << 10, uint64_t{25} << 20}) {
            for (int rank = 0; rank < dp; ++rank) {
              const CudaDataParallelPlan dpp{.dp = dp, .rank = rank, .zero = zero, .bucket_bytes = bucket};
              Result<EngineMemory> off = plan_cuda_rank_memory(m, static_cast<int>(micro), tp, 1, 0, 1,
                                                               CudaPipeSchedule::kOneFOneB, dpp, 1, false);
              Result<EngineMemory> on = plan_cuda_rank_memory(m, static_cast<int>(micro), tp, 1, 0, 1,
                                                              CudaPipeSchedule::kOneFOneB, dpp, 1, true);
              ASSERT_TRUE(off.ok() && on.ok()) << off.error() << on.error();
              const std::vector<FlatRange> runs =
                  shard_plan_make(t, dp, rank, zero, bucket).gradient_runs(partial);
              uint64_t packed = 0;
              for (const FlatRange& r : runs) packed += r.count;
              const std::string at = "L " + std::to_string(l) + " tp " + std::to_string(tp) + " dp " +
                                     std::to_string(dp) + " rank " + std::to_string(rank) + " zero " +
                                     std::to_string(zero) + " bucket " + std::to_string(bucket);
              EXPECT_EQ(row_bytes(on.value(), "sp_packed"), 4 * packed) << at;
              EXPECT_EQ(row_bytes(on.value(), "sp_runs"), 2 * 24 * runs.size()) << at;
              EXPECT_EQ(row_bytes(on.value(), "layer.res2"), l * (n / tp) * c * 2) << at;
              EXPECT_EQ(row_bytes(off.value(), "layer.res2"), l * n * c * 2) << at;
              EXPECT_EQ(on->total + 2 * l * (n - n / tp) * c * 2, off->total + 4 * packed + 48 * runs.size())
                  << at;
            }
          }
        }
      }
    }
  }
  // Inside pipeline stages the backend refuses it: the table is pp's own.
  const PlanModel m = plan_model_of(kTpPpModels[1]);
  EXPECT_EQ(plan_cuda_rank_memory(m, 2, 2, 2, 0, 2, CudaPipeSchedule::kOneFOneB, {}, 1, true)->total,
            plan_cuda_rank_memory(m, 2, 2, 2, 0, 2, CudaPipeSchedule::kOneFOneB, {}, 1, false)->total);
}

// ZeRO over dp: each dp rank's state is what engine/core/parallel/shard_plan.cpp cuts for it from the rank's
// tensor table (ZeroDeviceState's sizes: the shard S in the master weights and moments from ZeRO 1, the
// gradients and their staging slots from 2, the bf16 parameters and the gathered units from 3; one AdamW
// chunk per 64K elements of each owned segment), for buckets that divide unevenly (the low ranks own one
// element more), small buckets (several a stage) and large ones, at tp and on pipeline stages, interleaved
// ones too (each chunk's first block begins a bucket: pipeline_chunk_bucket_starts).
TEST(PlanEngineProfile, CudaZeroShardsAreTheShardPlans) {
  for (const ModelConfig& mc : kTpPpModels) {
    const PlanModel m = plan_model_of(mc);
    for (int tp : {1, 2}) {
      for (auto [pp, vp] : {std::pair{1, 1}, {2, 1}, {2, 2}, {3, 1}, {3, 2}}) {
        if (pp * vp > mc.n_layer) continue;
        const CudaPipeSchedule schedule =
            vp > 1 ? CudaPipeSchedule::kInterleaved : CudaPipeSchedule::kOneFOneB;
        const int micro_batches = vp > 1 ? pp : 2;
        const PipelinePartition part = pipeline_partition(mc, pp * vp, ClassifierGradStage::kLast);
        for (int stage = 0; stage < pp; ++stage) {
          const TensorTable st = pipeline_rank_table(mc, part, pp, stage);
          const TensorTable t = tp > 1 ? tensor_parallel_stage_table(mc, tp, 0, st) : st;
          // ZeroDeviceState's constructor: the embeddings lead the table and the final norm ends it
          // (layer -1) where the stage has them; the units between are blocks.
          const bool has_embeddings = t[0].layer < 0;
          for (int dp : {2, 3}) {
            for (int zero = 0; zero <= 3; ++zero) {
              for (uint64_t bucket : {uint64_t{50} << 10, uint64_t{25} << 20}) {
                for (int rank = 0; rank < dp; ++rank) {
                  const ShardPlan sp = shard_plan_make(t, dp, rank, zero, bucket,
                                                       pipeline_chunk_bucket_starts(part, pp, stage));
                  uint64_t chunks = 0;
                  if (zero == 0) {
                    for (const TensorInfo& x : t.tensors()) chunks += (x.numel + 65535) / 65536;
                  } else {
                    for (const ShardSegment& g : sp.segments) chunks += (g.count + 65535) / 65536;
                  }
                  Result<EngineMemory> e = plan_cuda_rank_memory(
                      m, 2, tp, pp, stage, micro_batches, schedule,
                      {.dp = dp, .rank = rank, .zero = zero, .bucket_bytes = bucket}, vp);
                  ASSERT_TRUE(e.ok()) << e.error();
                  const std::string at = "L " + std::to_string(mc.n_layer) + " tp " + std::to_string(tp) +
                                         " pp " + std::to_string(pp) + " vp " + std::to_string(vp) +
                                         " stage " + std::to_string(stage) + " dp " + std::to_string(dp) +
                                         " rank " + std::to_string(rank) + " zero " + std::to_string(zero) +
                                         " bucket " + std::to_string(bucket);
                  const uint64_t p = t.numel(), s = sp.shard_numel;
                  EXPECT_EQ(row_bytes(e.value(), "master"), 4 * (zero == 0 ? p : s)) << at;
                  EXPECT_EQ(row_bytes(e.value(), "adam_v"), 4 * (zero == 0 ? p : s)) << at;
                  EXPECT_EQ(row_bytes(e.value(), "grads"), 4 * (zero < 2 ? p : s)) << at;
                  EXPECT_EQ(row_bytes(e.value(), "params_bf16"), 2 * (zero < 3 ? p : s)) << at;
                  EXPECT_EQ(row_bytes(e.value(), "adamw_chunks"), 32 * chunks) << at;
                  EXPECT_EQ(row_bytes(e.value(), "chunk_scratch"),
                            zero > 0 || tp > 1 || pp > 1 ? 4 * chunks : 0)
                      << at;
                  const int n_units = static_cast<int>(sp.units.size());
                  const bool has_final = t[t.size() - 1].layer < 0 && n_units > (has_embeddings ? 1 : 0);
                  uint64_t largest_block = 0, largest_other_bucket = 0;
                  for (int u = has_embeddings ? 1 : 0; u <= n_units - 1 - (has_final ? 1 : 0); ++u)
                    largest_block = std::max<uint64_t>(largest_block, sp.units[static_cast<size_t>(u)].count);
                  const int embedding_bucket = has_embeddings ? sp.unit_bucket[0] : -1;
                  for (size_t g = 0; g < sp.buckets.size(); ++g) {
                    if (static_cast<int>(g) != embedding_bucket)
                      largest_other_bucket = std::max<uint64_t>(largest_other_bucket, sp.buckets[g].count);
                  }
                  const uint64_t grad_slots =
                      zero >= 2
                          ? 4 * ((has_embeddings ? sp.buckets[static_cast<size_t>(embedding_bucket)].count
                                                 : 0) +
                                 2 * std::max<uint64_t>(largest_other_bucket, 1))
                          : 0;
                  EXPECT_EQ(row_bytes(e.value(), "grad_slots"), grad_slots) << at;
                  const uint64_t param_slots = zero == 3 ? 2 * ((has_embeddings ? sp.units[0].count : 0) +
                                                                (has_final ? sp.units.back().count : 0) +
                                                                2 * std::max<uint64_t>(largest_block, 1))
                                                         : 0;
                  EXPECT_EQ(row_bytes(e.value(), "param_slots"), param_slots) << at;
                  // The whole rank: its state, staging and gathered units beside the unsharded rest.
                  const EngineMemory whole =
                      plan_cuda_rank_memory(m, 2, tp, pp, stage, micro_batches, schedule, {}, vp).value();
                  EXPECT_EQ(e->total - whole.total,
                            4 * (3 * ((zero == 0 ? p : s) - p) + (zero < 2 ? p : s) - p) +
                                2 * ((zero < 3 ? p : s) - p) + grad_slots + param_slots + 32 * chunks -
                                row_bytes(whole, "adamw_chunks") +
                                (zero > 0 || tp > 1 || pp > 1 ? 4 * chunks : 0) -
                                row_bytes(whole, "chunk_scratch"))
                      << at;
                }
              }
            }
          }
        }
      }
    }
  }
  // dp 1 shards nothing whatever ZeRO is asked; a pipeline stage takes ZeRO 0-3 under every vp 1 schedule
  // (ZB-H1's slots at ZeRO 2-3: CudaZbh1SlotsAtZero2And3HoldTheInputPasssGradients).
  const PlanModel m = plan_model_preset("gpt2-124m").value();
  EXPECT_EQ(plan_cuda_rank_memory(m, 4, 1, 1, 0, 1, false, {.dp = 1, .zero = 3})->total,
            plan_cuda_rank_memory(m, 4, 1, 1, 0, 1, false)->total);
  EXPECT_TRUE(plan_cuda_rank_memory(m, 4, 1, 2, 0, 2, true, {.dp = 2, .zero = 3}).ok());
  for (int zero = 0; zero <= 3; ++zero) {
    EXPECT_TRUE(
        plan_cuda_rank_memory(m, 4, 1, 2, 0, 2, CudaPipeSchedule::kZeroBubbleH1, {.dp = 2, .zero = zero})
            .ok())
        << zero;
  }
}

// The "slot ..." row of a CUDA stage's table (an empty row where there is none).
EngineAllocation slot_row(const EngineMemory& e) {
  for (const EngineAllocation& a : e.allocations)
    if (a.name.rfind("slot", 0) == 0) return a;
  return EngineAllocation{};
}

// fn(model, plan model, tp, pp, stage, the stage's layers) for every CUDA pipeline stage the ZB-H1 tests
// check: the tp-pp models, tp 1-2, pp 2 up to min(4, layers).
template <typename Fn>
void for_each_zbh1_stage(Fn fn) {
  for (const ModelConfig& mc : kTpPpModels) {
    const PlanModel m = plan_model_of(mc);
    for (int tp : {1, 2}) {
      for (int pp = 2; pp <= std::min(4, mc.n_layer); ++pp) {
        const std::vector<int> layers = plan_cuda_pipeline_layers(m, pp);
        for (int stage = 0; stage < pp; ++stage)
          fn(mc, m, tp, pp, stage, static_cast<uint64_t>(layers[static_cast<size_t>(stage)]));
      }
    }
  }
}

// ZB-H1's slots: min(m, pp) on every stage, each also keeping its blocks' output gradients for the weight
// pass (KeptGrads: d(res3), d(res2) (N, C), d(fch) (N, 4C/tp), d(qkv) (N, 3C/tp), bf16), the last stage's
// its d(logits) too (N, V/tp), bf16, for the classifier's weight product; nothing else differs from 1F1B.
TEST(PlanEngineProfile, CudaZbh1SlotsKeepEachBlocksOutputGradients) {
  for_each_zbh1_stage([](const ModelConfig& mc, const PlanModel& m, int tp, int pp, int stage, uint64_t l) {
    for (int micro : {1, pp, 3 * pp}) {
      const std::string at = "L " + std::to_string(mc.n_layer) + " tp " + std::to_string(tp) + " pp " +
                             std::to_string(pp) + " stage " + std::to_string(stage) + " m " +
                             std::to_string(micro);
      const EngineMemory zb =
          plan_cuda_rank_memory(m, 2, tp, pp, stage, micro, CudaPipeSchedule::kZeroBubbleH1).value();
      const EngineMemory ob =
          plan_cuda_rank_memory(m, 2, tp, pp, stage, micro, CudaPipeSchedule::kOneFOneB).value();
      const EngineAllocation zslot = slot_row(zb), oslot = slot_row(ob);
      ASSERT_FALSE(zslot.name.empty()) << at;  // a slot row exists
      ASSERT_FALSE(oslot.name.empty()) << at;
      EXPECT_NE(zslot.name.find("kept grads"), std::string::npos) << zslot.name;
      EXPECT_EQ(zslot.count,
                static_cast<uint64_t>(replayed_slots(CudaPipeSchedule::kZeroBubbleH1, pp, stage, micro)))
          << at;
      const uint64_t n = 2ull * mc.seq_len, c = static_cast<uint64_t>(mc.n_embd);
      const uint64_t kept =
          2 * (2 * n * c + n * 4 * c / static_cast<uint64_t>(tp) + n * 3 * c / static_cast<uint64_t>(tp));
      // The last stage's slot also keeps the (N, V/tp) d(logits) for the weight pass's dwte product, bf16.
      const uint64_t dlogits =
          stage == pp - 1 ? 2 * n * static_cast<uint64_t>(mc.vocab_size) / static_cast<uint64_t>(tp) : 0;
      EXPECT_EQ(zslot.bytes_each, oslot.bytes_each + l * kept + dlogits) << at;
      EXPECT_EQ(zb.total - zslot.bytes(), ob.total - oslot.bytes()) << at;
    }
  });
}

// ZB-H1 at ZeRO 2-3 on a dp axis: each slot also holds StageSlot::early, the input pass's parameter
// gradients (each block's six C-wide ones, whole C at any tp, and the last stage's final norm's two, fp32);
// not at ZeRO 0-1, not at dp 1 (ZeRO 0 whatever is asked). Everything else is 1F1B's at the same ZeRO stage.
TEST(PlanEngineProfile, CudaZbh1SlotsAtZero2And3HoldTheInputPasssGradients) {
  for_each_zbh1_stage([](const ModelConfig& mc, const PlanModel& m, int tp, int pp, int stage, uint64_t l) {
    const uint64_t c = static_cast<uint64_t>(mc.n_embd), early = 4 * (6 * l + (stage == pp - 1 ? 2 : 0)) * c;
    const EngineAllocation plain =
        slot_row(plan_cuda_rank_memory(m, 2, tp, pp, stage, pp, CudaPipeSchedule::kZeroBubbleH1).value());
    ASSERT_GT(plain.bytes_each, 0u);
    for (int zero = 0; zero <= 3; ++zero) {
      for (int dp : {1, 2, 3}) {
        const std::string at = "L " + std::to_string(mc.n_layer) + " tp " + std::to_string(tp) + " pp " +
                               std::to_string(pp) + " stage " + std::to_string(stage) + " zero " +
                               std::to_string(zero) + " dp " + std::to_string(dp);
        const CudaDataParallelPlan dpp{.dp = dp, .rank = dp - 1, .zero = zero, .bucket_bytes = 4096};
        const EngineMemory zb =
            plan_cuda_rank_memory(m, 2, tp, pp, stage, pp, CudaPipeSchedule::kZeroBubbleH1, dpp).value();
        const EngineMemory ob =
            plan_cuda_rank_memory(m, 2, tp, pp, stage, pp, CudaPipeSchedule::kOneFOneB, dpp).value();
        const EngineAllocation zslot = slot_row(zb);
        const bool has_early = dp > 1 && zero >= 2;
        EXPECT_EQ(zslot.bytes_each, plain.bytes_each + (has_early ? early : 0)) << at;
        EXPECT_EQ(zslot.name.find("early") != std::string::npos, has_early) << zslot.name;
        EXPECT_EQ(zslot.count, static_cast<uint64_t>(pp)) << at;  // min(m, pp) at m = pp
        EXPECT_EQ(zb.total - zslot.bytes(), ob.total - slot_row(ob).bytes()) << at;
      }
    }
  });
}

// ---- gantry-cpu under ZeRO 1-3 and ZB-H1.

// At dp 1 the CPU backend keeps the ZeRO stage it is given (the shard is the whole table, the staging and
// ZeRO 3's slots are still allocated): the real backend's memory_bytes() for every shape and stage, exactly.
TEST(PlanEngineProfile, CpuRankMemoryIsTheCpuBackendsAtEveryZeroStage) {
  for (const Shape& s : kCpuShapes) {
    for (int zero = 0; zero <= 3; ++zero) {
      std::unique_ptr<Backend> be =
          backend_cpu_create(s.model, s.micro_batch, BackendOptions{.threads = 1, .zero = zero});
      Result<EngineMemory> mem =
          plan_cpu_rank_memory(plan_model_of(s.model), s.micro_batch, 1, {.dp = 1, .zero = zero});
      ASSERT_TRUE(mem.ok()) << mem.error();
      EXPECT_EQ(mem->backend_bytes, be->memory_bytes()) << "L" << s.model.n_layer << " zero " << zero;
      EXPECT_EQ(mem->total, be->memory_bytes());
    }
  }
}

// Over dp, each rank's state is ZeroHostState's on shard_plan_make's plan of its table: shard_memory's
// formula, per dp rank, for the whole model (pp 1, tp 1 and 2) and for every pipeline stage (whose end
// units stand in for the embeddings and the final norm), with buckets small enough to split the blocks.
TEST(PlanEngineProfile, CpuZeroShardsAreTheShardPlans) {
  const ModelConfig models[] = {
      {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64},
      {.n_layer = 5, .n_head = 2, .n_embd = 48, .vocab_size = 78, .seq_len = 40},
  };
  for (const ModelConfig& mc : models) {
    const PlanModel pm = plan_model_of(mc);
    for (size_t bucket : {size_t{25} << 20, size_t{20000}}) {
      for (int dp : {2, 3}) {
        for (int zero = 1; zero <= 3; ++zero) {
          for (int rank = 0; rank < dp; ++rank) {
            const CpuDataParallelPlan dpp{.dp = dp, .rank = rank, .zero = zero, .bucket_bytes = bucket};
            const std::string label = "L" + std::to_string(mc.n_layer) + " bucket " + std::to_string(bucket) +
                                      " dp " + std::to_string(dp) + " rank " + std::to_string(rank) +
                                      " zero " + std::to_string(zero);
            for (int tp : {1, 2}) {
              const TensorTable t = tensor_parallel_stage_table(mc, tp, 0, gpt_param_table(mc));
              const ShardMemory want = shard_memory(shard_plan_make(t, dp, rank, zero, bucket));
              Result<EngineMemory> got = plan_cpu_rank_memory(pm, 2, tp, dpp);
              ASSERT_TRUE(got.ok()) << got.error();
              EXPECT_EQ(got->weights, want.params * 4) << label << " tp " << tp;
              EXPECT_EQ(got->gradients, want.grads * 4) << label << " tp " << tp;
              EXPECT_EQ(got->optimizer, want.optimizer * 4) << label << " tp " << tp;
            }
            for (int pp = 2; pp <= std::min(4, mc.n_layer); ++pp) {
              const PipelinePartition part = pipeline_partition(mc, pp);
              for (int stage = 0; stage < pp; ++stage) {
                const TensorTable t = pipeline_rank_table(mc, part, pp, stage);
                const ShardMemory want = shard_memory(shard_plan_make(t, dp, rank, zero, bucket));
                Result<EngineMemory> got =
                    plan_cpu_pipeline_memory(pm, 2, 1, pp, stage, pp, CudaPipeSchedule::kOneFOneB, dpp);
                ASSERT_TRUE(got.ok()) << got.error();
                // The state's rows, and the stage's whole buffers for the step: ZeRO 2-3's gradients, ZeRO
                // 3's parameters.
                const EngineMemory& e = got.value();
                EXPECT_EQ(row_bytes(e, "params") + row_bytes(e, "param_slots"), want.params * 4)
                    << label << " stage " << stage;
                EXPECT_EQ(row_bytes(e, "grads") + row_bytes(e, "grad_staging"), want.grads * 4)
                    << label << " stage " << stage;
                EXPECT_EQ(row_bytes(e, "adam_m") + row_bytes(e, "adam_v"), want.optimizer * 4)
                    << label << " stage " << stage;
                EXPECT_EQ(row_bytes(e, "work_params"), zero >= 3 ? t.numel() * 4 : 0) << label;
                EXPECT_EQ(row_bytes(e, "work_grads"), zero >= 2 ? t.numel() * 4 : 0) << label;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(plan_cpu_rank_memory(plan_model_of(models[0]), 2, 1, {.dp = 2, .rank = 2, .zero = 1}).ok());
}

// The CPU pipeline's acquire() and release() under each schedule (backend_cpu_pipeline.cpp run_step: a
// slot taken at an activation's receive or virtual stage 0's forward; freed at the gradient's send after a
// whole backward, at once on stage 0, or under ZB-H1 at the weight pass): the replayed program's counts.
TEST(PlanEngineProfile, CpuPipelineSlotsAreWhatTheStagesProgramsHoldUnderEverySchedule) {
  for (int pp = 2; pp <= 6; ++pp) {
    for (int m = 1; m <= 4 * pp; ++m) {
      for (int stage = 0; stage < pp; ++stage) {
        for (CudaPipeSchedule c :
             {CudaPipeSchedule::kGpipe, CudaPipeSchedule::kOneFOneB, CudaPipeSchedule::kZeroBubbleH1}) {
          EXPECT_EQ(plan_cpu_pipeline_slots(pp, stage, m, c), replayed_slots(c, pp, stage, m))
              << static_cast<int>(c) << " pp " << pp << " m " << m << " stage " << stage;
        }
      }
    }
  }
}

// ZB-H1 on the CPU: min(m, p) slots on every stage, each with its blocks' four kept output gradients
// (d_fcproj, d_proj (N, C), d_fc (N, 4C/tp), d_qkv (N, 3C/tp)); nothing else differs from 1F1B.
TEST(PlanEngineProfile, CpuZbh1SlotsKeepEachBlocksOutputGradients) {
  const PlanModel m =
      plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  const uint64_t n = 4 * 64, c = 64;
  for (int tp : {1, 2}) {
    for (int stage = 0; stage < 4; ++stage) {
      Result<EngineMemory> zb =
          plan_cpu_pipeline_memory(m, 4, tp, 4, stage, 8, CudaPipeSchedule::kZeroBubbleH1);
      Result<EngineMemory> one = plan_cpu_pipeline_memory(m, 4, tp, 4, stage, 8, CudaPipeSchedule::kOneFOneB);
      ASSERT_TRUE(zb.ok() && one.ok());
      const EngineAllocation* zs = nullptr;
      const EngineAllocation* os = nullptr;
      for (const EngineAllocation& a : zb->allocations)
        if (a.name.rfind("slot", 0) == 0) zs = &a;
      for (const EngineAllocation& a : one->allocations)
        if (a.name.rfind("slot", 0) == 0) os = &a;
      ASSERT_TRUE(zs != nullptr && os != nullptr);
      EXPECT_EQ(zs->count, 4u) << "min(m, p) on every stage";
      EXPECT_EQ(os->count, static_cast<uint64_t>(plan_pipeline_slots(4, stage, 8, false)));
      const uint64_t kept = (2 * n * c + n * 4 * c / tp + n * 3 * c / tp) * 4;  // one block, fp32
      EXPECT_EQ(zs->bytes_each - os->bytes_each, kept) << "one block a stage, tp " << tp;
      EXPECT_EQ(zb->total - zs->bytes(), one->total - os->bytes()) << "the rest is 1F1B's";
    }
  }
}

// The planner schedules ZB-H1: the engine's bubble formula (pipeline_schedule_bubble and the plan share
// telemetry/pipeline_bubble.h), a third of 1F1B's fill and drain, the same FLOPs; gantry-cuda's memory is
// plan_cuda_rank_memory's ZB-H1 table, at ZeRO 2-3 over dp too; gantry-cpu's the CPU stage's.
TEST(PlanEngineProfile, Zbh1IsAPlannerScheduleOnBothBackends) {
  for (int pp = 2; pp <= 8; ++pp) {
    for (int m = 1; m <= 3 * pp; ++m) {
      for (auto [s, c] : {std::pair{PipelineSchedule::kGpipe, Schedule::kGpipe},
                          std::pair{PipelineSchedule::kOneFOneB, Schedule::k1F1B},
                          std::pair{PipelineSchedule::kZeroBubbleH1, Schedule::kZeroBubbleH1}}) {
        EXPECT_DOUBLE_EQ(plan_bubble_step_fraction(c, pp, 1, m), pipeline_schedule_bubble(s, pp, 1, m));
      }
      EXPECT_DOUBLE_EQ(plan_bubble_step_fraction(Schedule::kInterleaved, pp, 2, m),
                       pipeline_schedule_bubble(PipelineSchedule::kInterleaved, pp, 2, m));
    }
  }
  PlanInput in;
  in.model = plan_model_preset("gpt2-124m").value();
  in.cluster = plan_cluster_default(plan_gpu_preset("h100").value(), 4);
  in.layout = PlanLayout{.pp = 4, .micro_batch = 4};
  in.training.global_batch = 32;
  in.engine = EngineKind::kGantryCuda;
  Result<Plan> one = plan_evaluate(in);
  in.layout.schedule = Schedule::kZeroBubbleH1;
  Result<Plan> zb = plan_evaluate(in);
  ASSERT_TRUE(one.ok() && zb.ok()) << one.error() << zb.error();
  EXPECT_EQ(zb->layout.schedule, Schedule::kZeroBubbleH1);
  EXPECT_DOUBLE_EQ(zb->bubble_step_fraction, 3.0 / (3 * 8 + 3));
  EXPECT_DOUBLE_EQ(zb->bubble_fraction, 3.0 / 24);
  // The split adds no FLOPs, only the input passes' copies of each block's d(res3) and d(res2) for the
  // weight passes ((N, C) bf16, read and written): more than none, at most every block's on one rank.
  const double keep_block = 2 * 2 * 2.0 * 4 * 1024 * 768 / in.cluster.gpu.hbm_bw;  // one micro-batch's
  EXPECT_GT(zb->compute_s, one->compute_s);
  EXPECT_LE(zb->compute_s - one->compute_s, 8 * 12 * keep_block * (1 + 1e-9));
  // The CUDA pipeline is priced by its programs' timing (PlanEngineProfile.GantryCudaPipelinesArePriced
  // AsTheirProgramsRun): its input passes are most of a backward, so the weight passes fill less than the
  // two thirds of the fill and drain the formula gives them: less idle time than 1F1B, more than a third.
  EXPECT_GT(zb->bubble_s, one->bubble_s / 3);
  EXPECT_LT(zb->bubble_s, one->bubble_s);
  ASSERT_EQ(zb->stage_memory.size(), 4u);
  for (int stage = 0; stage < 4; ++stage) {
    Result<EngineMemory> want =
        plan_cuda_rank_memory(in.model, 4, 1, 4, stage, 8, CudaPipeSchedule::kZeroBubbleH1);
    ASSERT_TRUE(want.ok());
    EXPECT_DOUBLE_EQ(zb->stage_memory[static_cast<size_t>(stage)].memory.total(),
                     static_cast<double>(want->total));
    EXPECT_DOUBLE_EQ(zb->stage_memory[static_cast<size_t>(stage)].microbatches_in_flight, 4);
  }
  PlanInput zero = in;
  zero.cluster.gpus = 8;
  zero.layout.zero = 1;
  zero.training.global_batch = 64;
  Result<Plan> z1 = plan_evaluate(zero);
  ASSERT_TRUE(z1.ok()) << z1.error();
  EXPECT_EQ(z1->stage_memory[0].dp_rank_totals.size(), 2u);
  // ZeRO 2-3 under ZB-H1: priced, every stage's dp ranks from plan_cuda_rank_memory.
  for (int z : {2, 3}) {
    zero.layout.zero = z;
    Result<Plan> zz = plan_evaluate(zero);
    ASSERT_TRUE(zz.ok()) << zz.error();
    ASSERT_EQ(zz->stage_memory.size(), 4u);
    for (int stage = 0; stage < 4; ++stage) {
      const Plan::StageMemory& sm = zz->stage_memory[static_cast<size_t>(stage)];
      ASSERT_EQ(sm.dp_rank_totals.size(), 2u);
      for (int k = 0; k < 2; ++k) {
        Result<EngineMemory> want = plan_cuda_rank_memory(
            in.model, 4, 1, 4, stage, 8, CudaPipeSchedule::kZeroBubbleH1,
            {.dp = 2, .rank = k, .zero = z, .bucket_bytes = zero.training.dp_bucket_bytes});
        ASSERT_TRUE(want.ok()) << want.error();
        EXPECT_DOUBLE_EQ(sm.dp_rank_totals[static_cast<size_t>(k)], static_cast<double>(want->total));
      }
    }
  }
  PlanInput vp = in;
  vp.engine = EngineKind::kGeneric;  // (gantry-cuda refuses vp 2 for its own reason first)
  vp.layout.vp = 2;
  Result<Plan> v2 = plan_evaluate(vp);
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.error().find("zbh1 runs one model chunk per rank"), std::string::npos) << v2.error();

  // gantry-cpu: the stage's ZB-H1 table, ZeRO 3 on dp included (the CPU stage keeps whole buffers).
  Result<Plan> cpu = cpu_plan(
      4, PlanLayout{.pp = 2, .zero = 3, .schedule = Schedule::kZeroBubbleH1, .micro_batch = 4}, 4, 16);
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  const PlanModel cm =
      plan_model_of({.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 256, .seq_len = 64});
  for (int stage = 0; stage < 2; ++stage) {
    for (int rank = 0; rank < 2; ++rank) {
      Result<EngineMemory> want = plan_cpu_pipeline_memory(
          cm, 4, 1, 2, stage, 2, CudaPipeSchedule::kZeroBubbleH1, {.dp = 2, .rank = rank, .zero = 3});
      ASSERT_TRUE(want.ok());
      EXPECT_DOUBLE_EQ(
          cpu->stage_memory[static_cast<size_t>(stage)].dp_rank_totals[static_cast<size_t>(rank)],
          static_cast<double>(want->total));
    }
  }
  bool work_params = false;
  for (const EngineAllocation& a : cpu->allocations) work_params |= a.name == "work_params";
  EXPECT_TRUE(work_params) << "ZeRO 3: the stage's whole parameters for the step";
  // Its step: a third of the 1F1B pipeline's fill and drain, the same work.
  Result<Plan> cpu_one = cpu_plan(2, PlanLayout{.pp = 2, .micro_batch = 4}, 2, 16);
  Result<Plan> cpu_zb =
      cpu_plan(2, PlanLayout{.pp = 2, .schedule = Schedule::kZeroBubbleH1, .micro_batch = 4}, 2, 16);
  ASSERT_TRUE(cpu_one.ok() && cpu_zb.ok());
  EXPECT_NEAR(cpu_zb->bubble_s, cpu_one->bubble_s / 3, 1e-12);
  EXPECT_DOUBLE_EQ(cpu_zb->compute_s, cpu_one->compute_s);
  // Under ZeRO 1-3 each dp rank's AdamW runs over its shard: half the parameters at dp 2.
  Result<Plan> cz0 = cpu_plan(2, PlanLayout{.micro_batch = 4}, 2, 16);
  Result<Plan> cz1 = cpu_plan(2, PlanLayout{.zero = 1, .micro_batch = 4}, 2, 16);
  ASSERT_TRUE(cz0.ok() && cz1.ok());
  const double calls = cz0->cpu_step.optimizer_s - cz0->params / plan_cpu_rates_default(1).optimizer_params;
  EXPECT_NEAR(cz1->cpu_step.optimizer_s - calls, (cz0->cpu_step.optimizer_s - calls) / 2, 1e-12);
}

}  // namespace
}  // namespace gantry
