// The what-if planner: for a model, a cluster, a layout and a training setup, the per-GPU memory by bucket
// (heaviest pipeline stage, against HBM), communication bytes and time per parallel axis (exposed and
// overlappable), the pipeline bubble, step time, tokens/s, MFU and HFU, days to train, the checkpoint's
// size and write time, the Young/Daly checkpoint interval and the expected goodput at the cluster's MTBF.
// Pure arithmetic over engine/plan's model, cluster, memory and reliability formulas; no dependencies.
// docs/PLANNER.md states every formula, its source and what is not modelled. With PlanInput::engine set to
// one of Gantry's backends, memory comes from that backend's allocation table (engine_profile.h).
//
//   PlanInput in;
//   in.model = plan_model_preset("gpt3-175b").value();
//   in.cluster = plan_cluster_default(plan_gpu_preset("a100-80gb").value(), 1024);
//   in.layout = {.tp = 8, .pp = 16, .vp = 2, .recompute = Recompute::kFull, .flash_attention = false};
//   in.training.global_batch = 1536;
//   Result<Plan> p = plan_evaluate(in);
//   if (!p.ok()) return p.error();              // names the field and what is allowed
//   p->memory.total(), p->tokens_per_s, p->mfu ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/cluster.h"
#include "engine/plan/engine_profile.h"
#include "engine/plan/layout.h"
#include "engine/plan/model.h"
#include "telemetry/status.h"

namespace gantry {

// Which FLOP count MFU and HFU use (model.h's FlopsPerToken): Gantry's 6N + 6LdT, which the engine
// prints, or Megatron's, which Narayanan et al. 2021 and Korthikanti et al. 2022 publish.
enum class FlopConvention { kGantry, kMegatron };
const char* flop_convention_name(FlopConvention c);  // "gantry", "megatron"

struct PlanTraining {
  int global_batch = 0;  // sequences per optimizer step; 0 = 2^20 tokens' worth (rounded up)
  double tokens = 0;     // tokens to train on; 0 = 20 per parameter (Hoffmann et al. 2022, "Chinchilla")
  // Bytes per parameter. The default is bf16 mixed precision with AdamW: bf16 weights and gradients, fp32
  // master weights and two fp32 moments, 16 bytes in all. Gantry's CPU engine: weights 4 (they are the
  // master copy), grads 4, master 0, optimizer 8.
  int weight_bytes = 2;
  int grad_bytes = 2;       // 4 for fp32 gradient accumulation
  int master_bytes = 4;     // 0 when the weights themselves are fp32
  int optimizer_bytes = 8;  // AdamW m and v in fp32
  // gantry-cuda's ZeRO buckets (a config's train.dp_bucket_mb): where its shards are cut.
  uint64_t dp_bucket_bytes = 25ull << 20;
  // Checkpoint: bytes stored per parameter (Gantry's format: fp32 weights, m, v = 12) and the aggregate
  // write bandwidth; 0 = 1 GB/s per node (Narayanan et al. 2021 §5.10 measured 273 GB/s from 384 nodes,
  // 0.7 GB/s each; Llama 3 §3.3.1 quotes 2 TB/s sustained for 2,048 nodes, about 1 GB/s each).
  double checkpoint_bytes_per_param = 12;
  double checkpoint_write_bw = 0;
  double restart_s = 600;  // time from a failure to training again (Daly 2006's examples use R = 10 min)
  // Memory the planner does not derive: CUDA context, cuBLAS and NCCL workspaces (an assumption).
  double runtime_reserved_bytes = 1024.0 * 1024.0 * 1024.0;
  // Gradient all-reduce bucket: PyTorch DDP's default bucket_cap_mb = 25; two are live while overlapping.
  double bucket_bytes = 25.0 * 1024.0 * 1024.0;
  FlopConvention mfu_convention = FlopConvention::kGantry;
  // Tensor-parallel communication overlap: the fraction of the product next to each tp collective (the
  // row-parallel GEMM whose output it reduces, forward; the weight-gradient GEMM of the layer whose input
  // gradient it reduces, backward) that hides it, the collective split into chunks that travel while the
  // next chunk's product runs. Exposed = comm − min(comm, overlap × product). 0: no overlap (the CPU
  // backend, whose collectives block); about 1 − 1/chunks for a GPU stack that chunks its TP GEMMs.
  double tp_overlap = 0;
};

struct PlanInput {
  PlanModel model;
  ClusterSpec cluster;
  PlanLayout layout;
  PlanTraining training;
  // Which stack runs the job. gantry-cpu and gantry-cuda (engine_profile.h) predict memory from that
  // backend's allocation table instead of the generic model, set the dtypes to the backend's (CPU: fp32
  // weights 4, grads 4, AdamW 8; CUDA: bf16 weights 2, fp32 grads 4, master 4, AdamW 8) and run on one
  // device (the engine has no parallelism yet). gantry-cpu prices its step with `cpu` (the cluster's GPU
  // then gives only the memory `fits` compares with); gantry-cuda with the generic time model, at the
  // efficiency its kernels were measured at where there is one: set cluster.gpu.compute_efficiency to
  // plan_engine_compute_efficiency(engine, gpu name) when it is > 0 (gantry-engine plan does).
  EngineKind engine = EngineKind::kGeneric;
  CpuRates cpu = plan_cpu_rates_default();
  // gantry-cpu: the cores of the host its ranks share (cluster.gpus_per_node ranks to a host, each with
  // cpu.threads threads); 0 = a core for every thread. Fewer cores than threads stretch the compute: a
  // step is never shorter than the host's CPU work over its cores.
  int cpu_cores = 0;
  // gantry-cpu: runnable threads of other work on the host (a load average, less the job's own), which
  // share the cores with the job's threads; 0 = the host is the job's. `--measure-cpu` samples it.
  double cpu_background = 0;
};

// Per-GPU bytes on the heaviest pipeline stage.
struct MemoryBuckets {
  double weights = 0;  // parameters as the forward uses them (bf16), or their ZeRO-3 shard
  double gradients = 0;
  double optimizer = 0;  // fp32 master weights and AdamW moments
  double activations =
      0;               // stored for backward (Korthikanti et al. 2022) incl. pipeline in-flight micro-batches
  double buffers = 0;  // runtime reserve, gradient buckets, ZeRO-3 gathered layers, pipeline send/receive
  double total() const { return weights + gradients + optimizer + activations + buffers; }
};

// Communication of one parallel axis in one optimizer step, per GPU.
struct CommAxis {
  std::string axis;     // "tp", "cp", "pp", "dp"
  std::string pattern;  // what runs, e.g. "all-reduce x4 per layer per micro-batch"
  int group = 1;        // ranks in the group
  bool crosses_nodes = false;
  double bus_bw = 0;          // bytes/s the group's link gives (plan_group_link)
  double bytes = 0;           // nccl-tests' S summed over the step's calls
  double seconds = 0;         // alpha-beta time of those calls
  double exposed_s = 0;       // on the critical path
  double overlappable_s = 0;  // hidden under compute (seconds − exposed_s)
};

struct Plan {
  EngineKind engine = EngineKind::kGeneric;
  PlanLayout layout;  // as evaluated: dp resolved, schedule interleaved when vp > 1
  int gpus = 0;
  int nodes = 0;
  int global_batch = 0;   // sequences per step
  int micro_batches = 0;  // m: micro-batches per pipeline per step
  uint64_t params = 0;    // exact
  ParamCounts counts;

  // Memory on the heaviest stage.
  MemoryBuckets memory;
  int memory_stage = 0;               // which pipeline stage is heaviest (0-based)
  uint64_t params_on_gpu = 0;         // parameters that stage's GPU owns before ZeRO sharding
  double activation_layer_bytes = 0;  // stored per layer per micro-batch
  double microbatches_in_flight = 0;  // on the heaviest stage
  double hbm_bytes = 0;
  bool fits = false;
  // Engine profiles only: the backend's allocation table and what its Backend::memory_bytes() reports
  // (memory.total() less what the backend does not count, the CUDA backend's cuBLASLt workspace).
  std::vector<EngineAllocation> allocations;
  double backend_bytes = 0;
  // Engine profiles only: every pipeline stage's rank (one entry at pp 1), stage 0 first. Each tp rank of a
  // stage, and each dp replica (ZeRO 0), holds the same bytes.
  struct StageMemory {
    int stage = 0;
    int layers = 0;                     // blocks on the stage
    MemoryBuckets memory;               // what the engine takes (its table's total)
    double backend_bytes = 0;           // what its Backend::memory_bytes() reports
    double microbatches_in_flight = 0;  // activation slots (1 at pp 1)
    // Under ZeRO 1-3 (and dp <= kDpRanksListed), every dp rank's total and memory_bytes(), dp rank 0
    // first (the figures above are dp rank 0's); empty otherwise (every dp rank holds the same).
    std::vector<double> dp_rank_totals, dp_rank_backend_bytes;
  };
  static constexpr int kDpRanksListed = 64;
  std::vector<StageMemory> stage_memory;

  std::vector<CommAxis> comm;

  // Time per step.
  double bubble_fraction = 0;       // (p − 1)/(k·m) of the ideal step: k 1, v interleaved, 3 ZB-H1
  double bubble_step_fraction = 0;  // (p − 1)/(k·m + p − 1) of the step (the engine's formula)
  double compute_s = 0;             // m micro-batches' forward, backward and recompute
  double bubble_s = 0;              // pipeline fill and drain
  double exposed_comm_s = 0;
  double optimizer_s = 0;  // AdamW over the local shard, memory-bound
  CpuStep cpu_step;        // gantry-cpu: the slowest rank's step by kind of loop (its compute, no waits)
  double cpu_share = 0;  // gantry-cpu: runnable threads on the host (the job's and the background's) per core
  // gantry-cpu: how much longer the host's work takes with every rank running than with a core per thread
  // (1 while the cores outnumber the runnable threads), the blocking collectives the slowest rank issues
  // a step, and the host CPU seconds all ranks' collectives take a step (kernel and Gloo thread).
  double cpu_oversubscription = 1;
  double cpu_collectives = 0;
  double cpu_comm_cpu_s = 0;
  double cpu_host_cpu_s = 0;  // gantry-cpu: every rank's CPU seconds a step, its collectives' included
  double step_s = 0;
  double tokens_per_s = 0;

  // Utilisation, with the convention and peak they use.
  FlopConvention convention = FlopConvention::kGantry;
  double peak_flops = 0;                // per GPU
  double model_flops_per_token = 0;     // the convention's training FLOPs per token
  double hardware_flops_per_token = 0;  // plus recomputation
  double mfu = 0;                       // model FLOPs / (step time × GPUs × peak)
  double hfu = 0;                       // hardware FLOPs (with recomputation) / (step time × GPUs × peak)

  double tokens = 0;         // to train on
  double days_to_train = 0;  // no failures, no checkpoints
  double checkpoint_bytes = 0;
  double checkpoint_write_s = 0;
  double cluster_mtbf_s = 0;  // node MTBF / nodes
  double young_interval_s = 0;
  double daly_interval_s = 0;
  double goodput = 0;  // useful / elapsed at the Daly interval (Daly 2006's expected wall time)
  double days_to_train_expected = 0;  // with failures, restarts and checkpoints
};

// The tensor-parallel overlap rule (PlanTraining::tp_overlap): of a collective of `comm_s` next to a product
// of `product_s`, what stays on the critical path: comm − min(comm, overlap × product).
double plan_tp_exposed_seconds(double comm_s, double product_s, double overlap);

// Validates the input (the message names the field and the allowed values) and evaluates it.
Result<Plan> plan_evaluate(const PlanInput& in);

// MFU and HFU from a measured (for example a published) step time, with the FLOPs of `convention`.
struct Utilization {
  double model_flops_per_step = 0;
  double hardware_flops_per_step = 0;
  double mfu = 0;
  double hfu = 0;
};
Utilization plan_utilization(const PlanModel& m, Recompute r, double global_batch, double step_s, int gpus,
                             double peak_flops, FlopConvention convention);

// Training FLOPs per token under `convention`, and the same plus what recomputation adds.
// Megatron: full recompute adds one forward of the blocks (Narayanan et al. 2021 eq. 3); selective adds
// the attention core's training FLOPs once more, 72·B·s·l·h²·s/(6h) per step, the accounting of
// Korthikanti et al. 2022 appendix A behind their published HFU. Gantry: full adds one forward of the
// blocks (2 FLOPs per block parameter + the causal 2·d·T attention), selective the causal attention
// forward (2·L·d·T); flash attention's own recomputation is not counted in either.
double plan_model_flops_per_token(const PlanModel& m, FlopConvention convention);
double plan_hardware_flops_per_token(const PlanModel& m, Recompute r, FlopConvention convention);

}  // namespace gantry
