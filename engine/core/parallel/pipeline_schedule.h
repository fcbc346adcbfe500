// Pipeline parallelism over the pp axis: how GPT-2's layers split into stages, the order in which a stage
// runs its micro-batches' forward and backward passes (GPipe, 1F1B), the bubble those orders leave, and
// which layouts can run at all. Pure arithmetic, the same on every rank; the CPU backend's pipeline
// (cpu/backend_cpu_pipeline.cpp) executes it.
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
#include "telemetry/status.h"

namespace gantry {

enum class PipelineSchedule {
  kGpipe,     // every micro-batch's forward, then every backward (m activations held)
  kOneFOneB,  // warm-up forwards, then one forward and one backward in turn (at most p held)
};
// "gpipe", "1f1b": train.pp_schedule's values.
const char* pipeline_schedule_name(PipelineSchedule s);
bool pipeline_schedule_from_name(const std::string& name, PipelineSchedule* out);

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

// The model's cost per token, forward and backward (3 x the forward's FLOPs): a block 3·(24·C² + 4·T·C);
// the classifier's forward and input gradient (2 x 2·V·C) on the last stage, its weight gradient
// (2·V·C) on the first. pipeline_partition splits the layers into `pp` contiguous runs of at least one
// layer each that minimise the costliest stage (exact, by dynamic programming over the split points).
double pipeline_block_cost(const ModelConfig& m);
PipelinePartition pipeline_partition(const ModelConfig& m, int pp);

// Stage `stage`'s tensors, in gpt_param_table's order and with its names and layer indices: wte and wpe
// (stage 0), its blocks, lnf (last stage). pipeline_slice copies each of `stage`'s tensors out of a
// whole-model buffer laid out by `whole`.
TensorTable pipeline_stage_table(const ModelConfig& m, const PipelinePartition& p, int stage);
void pipeline_slice(const TensorTable& whole, const float* all, const TensorTable& stage, float* out);

enum class PipelineOp { kForward, kBackward };
struct PipelineAction {
  PipelineOp op = PipelineOp::kForward;
  int micro = 0;
};
// Stage `stage`'s actions for one step of `m` micro-batches. Backward passes run in micro-batch order
// under every schedule, so a stage adds its gradients in the order one process adds them.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int pp, int stage, int m);
// Activations a stage holds at once under its actions (the slots it allocates).
int pipeline_in_flight(const std::vector<PipelineAction>& actions);

// The idle fraction of an ideal pipeline (equal stages, free communication): (p − 1) / (v·m + p − 1).
double pipeline_bubble_formula(int pp, int vp, int m);

// Whether the layout can run a pipeline: layers at least pp x vp, vp 1 (interleaved 1F1B is refused, naming
// vp), the CPU backend, ZeRO 0 or 1, at least pp micro-batches under 1F1B, no checkpoints or in-memory
// copies at pp > 1. The error names the numbers and what would be right. `micro_batches` is the
// gradient-accumulation count, global_batch / (dp x micro_batch).
Status pipeline_check(const Config& c, const ParallelDims& d, int micro_batches, int vp = 1);

}  // namespace gantry
