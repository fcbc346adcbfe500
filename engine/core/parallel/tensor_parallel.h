// Tensor parallelism (Megatron-style) over the tp axis: how GPT-2's tensors split across the tp ranks of
// one group, and which layouts can split at all. The CPU backend (cpu/backend_cpu.cpp) runs the split model.
//
// Each block's attention heads are divided over the tp ranks: rank r keeps heads [r·NH/tp, (r+1)·NH/tp),
// i.e. the matching rows of Q, K and V (column-parallel QKV) and the matching input columns of the output
// projection (row-parallel). The MLP's 4C hidden units split the same way (column-parallel up,
// row-parallel down). The token embedding (and so the tied classifier) splits by vocabulary rows: rank r
// keeps tokens [r·V/tp, (r+1)·V/tp) (vocab-parallel, cpu/vocab_parallel_cpu.h). LayerNorms, the position
// embedding and the row-parallel layers' biases stay whole on every rank: their gradients come out
// bit-identical on every tp rank, so their updates do too, with no communication. The CUDA backend
// (cuda/backend_cuda.cu, cuda/vocab_parallel.cuh) runs the same split with the same table.
// Each tensor of tensor_parallel_table records where its share lies in the whole tensor (TensorShare), so
// checkpoints are written and read in the whole model's coordinates and any tp loads any other's.
//
// Sequence parallelism (train.sequence_parallel, Megatron-LM SP, Korthikanti et al. 2022): between the
// row-parallel output and the next column-parallel input (the residual adds and LayerNorms, and the final
// norm) each tp rank holds only positions [r·T/tp, (r+1)·T/tp) of every sequence. The row-parallel
// layers' all-reduce becomes a reduce-scatter onto those positions, the column-parallel layers' input an
// all-gather (their backward: the other way round). The LayerNorms' weight gradients are then partial
// sums over this rank's positions and are all-reduced over tp; the row-parallel biases' gradients come
// from the gathered output gradient, whole on every rank. Inside pipeline stages (tp x pp,
// cpu/backend_cpu_pipeline.cpp) the same holds, and the activations and gradients passed between stages
// are this rank's positions only (matching tp ranks of neighbouring stages hold the same ones).
//
//   Status ok = tensor_parallel_check(cfg.model, dims, cfg.train.backend);   // before anything is built
//   TensorTable full = gpt_param_table(m), mine = tensor_parallel_table(m, tp, tp_rank);
//   tensor_parallel_slice(m, tp, tp_rank, full_params, my_params);            // whole model -> this rank
#pragma once

#include <string>

#include "engine/core/config.h"
#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/tensor_table.h"
#include "telemetry/status.h"

namespace gantry {

// Whether `d.tp` can split this model on this backend: n_head, the MLP width 4·n_embd and vocab_size must
// be multiples of tp, and with sequence parallelism seq_len too (pp is pipeline_check's,
// parallel/pipeline_schedule.h); tensor parallelism runs on the CPU backend and on the CUDA backend (there
// with pp too, without sequence parallelism). The error names the numbers and what would be right.
Status tensor_parallel_check(const ModelConfig& m, const ParallelDims& d, const std::string& backend,
                             bool sequence_parallel = false);

// Whether the tensor named `name` (gpt_param_table's names) is split over the tp ranks; false: every tp
// rank keeps it whole.
bool tensor_parallel_sharded(const std::string& name);

// gpt_param_table(m, tp) with each tensor's place in the whole model (TensorShare, tensor_table.h) for tp
// rank `tp_rank`: what a checkpoint writes and reads in the whole model's coordinates, so that any tp
// loads any other's. tp 1: gpt_param_table(m).
TensorTable tensor_parallel_table(const ModelConfig& m, int tp, int tp_rank);

// tensor_parallel_table(m, tp, tp_rank) restricted to the tensors named in `stage` (a pipeline stage's
// table, parallel/pipeline_schedule.h), in that order, each with its share: a stage's tensors at tp x pp.
TensorTable tensor_parallel_stage_table(const ModelConfig& m, int tp, int tp_rank, const TensorTable& stage);

// Copies tp rank `tp_rank`'s share of the whole model `full` (gpt_param_table(m)'s layout) into `local`
// (gpt_param_table(m, tp)'s layout); unslice copies the other way, the share into its place in `full`
// (whole tensors are copied too).
void tensor_parallel_slice(const ModelConfig& m, int tp, int tp_rank, const float* full, float* local);
void tensor_parallel_unslice(const ModelConfig& m, int tp, int tp_rank, const float* local, float* full);

}  // namespace gantry
