// Pipeline parallelism over the pp axis: how GPT-2's layers split into stages, the order in which a stage
// runs its micro-batches' forward and backward passes (GPipe, 1F1B, interleaved 1F1B over vp model chunks
// per rank, ZB-H1 with the weight-gradient pass split off), the bubble those orders leave, and which
// layouts can run at all. Pure arithmetic, the same on every rank; the CPU backend's pipeline
// (cpu/backend_cpu_pipeline.cpp) and the CUDA backend's stage (cuda/backend_cuda.cu) execute it. The
// orders and their message simulation (PipelineSchedule, pipeline_actions, pipeline_program) live in
// telemetry/pipeline_program.h, included here, which the planner replays too.
//
//   Status ok = pipeline_check(cfg, dims, micro_batches);               // before anything is built
//   PipelinePartition part = pipeline_partition(cfg.model, dims.pp);    // layers of each stage, by cost
//   std::vector<PipelineAction> a = pipeline_actions(PipelineSchedule::kOneFOneB, pp, stage, m);
//   double ideal = pipeline_bubble_formula(pp, 1, m);                   // (p - 1) / (v·m + p - 1)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/tensor_table.h"
#include "telemetry/pipeline_program.h"  // PipelineSchedule, pipeline_actions, pipeline_program
#include "telemetry/status.h"

namespace gantry {

// Stage s holds blocks [first_layer[s], first_layer[s] + layers[s]). Stage 0 also holds the embeddings and
// accumulates the tied classifier's weight gradient (wte is one tensor, owned there); the last stage
// holds the final norm and runs the classifier's forward and input gradient with a copy of wte.
struct PipelinePartition {
  std::vector<int> first_layer;
  std::vector<int> layers;
  std::vector<double> cost;  // estimated FLOPs per token of each stage, forward and backward
  // "stage 0: layers 0-1 (3.2 MFLOP/token), stage 1: layers 2-3 (3.4 MFLOP/token)"
  std::string describe() const;
};

// Where the tied classifier's weight gradient is computed: the CPU pipeline adds it on the first stage
// (micro-batch by micro-batch, in one process's order, from what the last stage sends), the GPU stage on the
// last (its fp32 V × C gradient sent to the first once a step).
enum class ClassifierGradStage { kFirst, kLast };

// The model's cost per token, forward and backward (3 x the forward's FLOPs): a block 3·(24·C² + 4·T·C);
// the classifier's forward and input gradient (2 x 2·V·C) on the last stage, its weight gradient
// (2·V·C) where `grad` says. pipeline_partition splits the layers into `pp` contiguous runs of at least one
// layer each that minimise the costliest stage (exact, by dynamic programming over the split points).
double pipeline_block_cost(const ModelConfig& m);
PipelinePartition pipeline_partition(const ModelConfig& m, int pp,
                                     ClassifierGradStage grad = ClassifierGradStage::kFirst);

// Stage `stage`'s tensors, in gpt_param_table's order and with its names and layer indices: wte and wpe
// (stage 0), its blocks, lnf (last stage). pipeline_slice copies each of `stage`'s tensors out of a
// whole-model buffer laid out by `whole`.
TensorTable pipeline_stage_table(const ModelConfig& m, const PipelinePartition& p, int stage);
void pipeline_slice(const TensorTable& whole, const float* all, const TensorTable& stage, float* out);

// Under interleaving (vp > 1) rank r holds vp model chunks: chunk c is virtual stage c·pp + r of
// pipeline_partition(m, pp·vp), so the layers go round-robin over the ranks in vp runs.
// pipeline_rank_table is the union of rank `rank`'s chunks' tensors (wte and wpe on rank 0, lnf on the
// last), in gpt_param_table's order; at vp 1 it is pipeline_stage_table.
TensorTable pipeline_rank_table(const ModelConfig& m, const PipelinePartition& virtual_stages, int pp,
                                int rank);
// The units of rank `rank`'s pipeline_rank_table (as shard_plan.h counts them: the embeddings on rank 0,
// then each block, then lnf) that begin its chunks 1 to vp − 1: shard_plan_make's `bucket_starts` for an
// interleaved GPU stage, whose backwards each complete their own chunk's buckets (cuda/backend_cuda.cu;
// engine/core/train.cpp prints the same plan). Empty at vp 1.
std::vector<int> pipeline_chunk_bucket_starts(const PipelinePartition& virtual_stages, int pp, int rank);

// The idle fraction of an ideal pipeline (equal stages, free communication): (p − 1) / (v·m + p − 1).
double pipeline_bubble_formula(int pp, int vp, int m);
// The schedule's own formula: (p − 1) / (m + p − 1) for GPipe and 1F1B, (p − 1) / (v·m + p − 1)
// interleaved, and for ZB-H1 (p − 1) / (3·m + p − 1): each stage idles (p − 1)(T_F + T_B − T_W) of
// m(T_F + T_B + T_W), a third of 1F1B's idle time at T_F = T_B = T_W (Qi et al., section 3.1).
double pipeline_schedule_bubble(PipelineSchedule s, int pp, int vp, int m);

// Whether the layout can run a pipeline: layers at least pp x vp, vp > 1 only with the interleaved schedule
// (and that one only with vp > 1 and micro-batches a multiple of pp), the CPU backend (or the CUDA one with
// any schedule at ZeRO 0 or 1, GPipe or 1F1B at ZeRO 2 or 3), at least pp
// micro-batches under 1F1B and ZB-H1, no in-memory copies at pp > 1 (checkpoints are written and loaded by
// tensor name, checkpoint.h). tp composes (tp x pp, tensor_parallel.h). The error names the numbers and what
// would be right. `micro_batches` is the gradient-accumulation count, global_batch / (dp x micro_batch).
Status pipeline_check(const Config& c, const ParallelDims& d, int micro_batches, int vp = 1);

}  // namespace gantry
