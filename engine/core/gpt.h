// The GPT-2 family model's parameter layout and initialisation: learned positions, pre-LN blocks,
// GELU MLP, tied token embedding as the output head. Linear weights are (out, in) row-major.
// Tensors are laid out block by block, so one block (a ZeRO-3 gather unit, a pipeline stage's share)
// is one contiguous range of the flat buffer.
//
//   TensorTable table = gpt_param_table(cfg.model);
//   std::vector<float> params(table.numel());
//   gpt_init_params(cfg.model, table, seed, params.data());
#pragma once

#include <cstdint>
#include <functional>

#include "engine/core/config.h"
#include "engine/core/tensor_table.h"

namespace gantry {

// Names: "wte" (V, C), "wpe" (T, C), then for each block l "h.<l>.ln1.weight" (C), "h.<l>.ln1.bias" (C),
// "h.<l>.attn.qkv.weight" (3C, C), "h.<l>.attn.qkv.bias" (3C), "h.<l>.attn.proj.weight" (C, C),
// "h.<l>.attn.proj.bias" (C), "h.<l>.ln2.weight", "h.<l>.ln2.bias", "h.<l>.mlp.fc.weight" (4C, C),
// "h.<l>.mlp.fc.bias" (4C), "h.<l>.mlp.proj.weight" (C, 4C), "h.<l>.mlp.proj.bias" (C); "lnf.weight",
// "lnf.bias" (C).
// tp > 1: one tensor-parallel rank's share (engine/core/parallel/tensor_parallel.h): the QKV and MLP-up
// rows, the attention and MLP-down projections' columns and wte's vocabulary rows divided by tp; everything
// else whole.
TensorTable gpt_param_table(const ModelConfig& m, int tp = 1);

// GPT-2's init: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0, norms 1.
// Deterministic in `seed` on a given machine.
void gpt_init_params(const ModelConfig& m, const TensorTable& table, uint64_t seed, float* params);

// Pointers to one block's tensors inside a flat buffer (parameters or gradients alike).
struct GptBlock {
  float* ln1_w;     // (C)
  float* ln1_b;     // (C)
  float* qkv_w;     // (3C, C)
  float* qkv_b;     // (3C)
  float* proj_w;    // (C, C)
  float* proj_b;    // (C)
  float* ln2_w;     // (C)
  float* ln2_b;     // (C)
  float* fc_w;      // (4C, C)
  float* fc_b;      // (4C)
  float* fcproj_w;  // (C, 4C)
  float* fcproj_b;  // (C)
};
struct GptTensors {
  float* wte;  // (V, C)
  float* wpe;  // (T, C)
  std::vector<GptBlock> blocks;
  float* lnf_w;  // (C)
  float* lnf_b;  // (C)
};
GptTensors gpt_tensors(const ModelConfig& m, const TensorTable& table, float* base);
// The same with each tensor's pointer chosen by `where` (a tensor kept in a buffer of its own, or null
// for tensors not at hand): ZeRO-3 holds one unit's parameters at a time.
GptTensors gpt_tensors(const ModelConfig& m, const TensorTable& table,
                       const std::function<float*(const TensorInfo&)>& where);

}  // namespace gantry
