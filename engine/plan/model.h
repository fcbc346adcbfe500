// The planner's description of a decoder-only transformer: its dimensions, its exact parameter count
// (tensor by tensor, as the engine's tensor table lays it out for the GPT-2 family), how those parameters
// split under tensor parallelism, and its FLOPs per token under the two conventions the planner reports.
// Pure arithmetic; no dependencies.
//
//   Result<PlanModel> m = plan_model_preset("gpt2-124m");
//   ParamCounts n = plan_param_counts(m.value());      // n.total == 124,475,904
//   FlopsPerToken f = plan_flops_per_token(m.value());  // f.gantry == 6N + 6·L·d·T
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

enum class FfnKind { kGelu, kSwiGlu };          // GPT-2/GPT-3 MLP, or Llama's gated MLP (three matrices)
enum class NormKind { kLayerNorm, kRmsNorm };   // LayerNorm has a bias, RMSNorm does not
enum class PositionKind { kLearned, kRotary };  // learned positions are a (T, d) table; RoPE has no weights

struct PlanModel {
  std::string name = "custom";
  int layers = 12;   // transformer blocks L
  int hidden = 768;  // width d (= heads × head_dim)
  int heads = 12;    // query heads a; must divide hidden
  int kv_heads = 0;  // key/value heads (grouped-query attention); 0 = heads; must divide heads
  int ffn = 0;       // MLP inner width; 0 = 4·hidden
  FfnKind ffn_kind = FfnKind::kGelu;
  int vocab = 50304;            // embedding rows V
  int seq = 1024;               // sequence length T (tokens per sample)
  bool tied_embeddings = true;  // the token embedding is also the output head
  PositionKind positions = PositionKind::kLearned;
  NormKind norm = NormKind::kLayerNorm;
  bool biases = true;  // linear layers carry biases (GPT-2, GPT-3) or not (Llama)
  bool dropout =
      false;  // dropout masks are stored for backward (Megatron's GPT-3 runs; not Gantry, not Llama)
};

// Range and divisibility checks; the message names the field and what is allowed.
Status plan_model_validate(const PlanModel& m);

int plan_model_kv_heads(const PlanModel& m);    // kv_heads, or heads when 0
int plan_model_ffn(const PlanModel& m);         // ffn, or 4·hidden when 0
int64_t plan_model_kv_dim(const PlanModel& m);  // kv_heads × head_dim: width of K (and of V)

// Presets: gpt2-124m, gpt2-350m, gpt3-175b, llama3-8b, llama3-70b, llama3-405b.
Result<PlanModel> plan_model_preset(std::string_view name);
const std::vector<std::string>& plan_model_preset_names();

// Exact parameter counts. The tied embedding is counted once (llm.c's and DESIGN.md's convention).
struct ParamCounts {
  uint64_t total = 0;
  uint64_t embedding = 0;  // token embedding (V, d)
  uint64_t positions = 0;  // learned position table (T, d); 0 with RoPE
  uint64_t per_layer = 0;  // one transformer block
  uint64_t final_norm = 0;
  uint64_t head = 0;  // untied output head (V, d); 0 when tied
};
ParamCounts plan_param_counts(const PlanModel& m);

// One block's parameters held by one tensor-parallel rank (Megatron's split): the QKV, MLP-in and
// column-parallel biases are split by output column, the attention/MLP output matrices by input row;
// norms and the row-parallel output biases stay whole on every rank. tp must divide the split widths
// (plan_layout_validate checks that); the result is exact.
uint64_t plan_layer_params_per_rank(const PlanModel& m, int tp);

// Training FLOPs per token (forward + backward), by convention.
struct FlopsPerToken {
  // DESIGN.md / llm.c: 6·N + 6·L·d·T. What the engine prints as MFU; the attention term counts the causal
  // half of the score and value products.
  double gantry = 0;
  // Megatron (Narayanan et al. 2021 eq. 3 without the recompute pass; Korthikanti et al. 2022 appendix A):
  // three times the forward matrix-multiply FLOPs, full s² attention, logits included, no norms or
  // embeddings. For GPT-3-shaped models this is 72·B·s·l·h²·(1 + s/6h + V/12lh) / (B·s).
  double megatron = 0;
};
FlopsPerToken plan_flops_per_token(const PlanModel& m);

// Forward FLOPs per token of the pieces, for the step-time model and the recompute accounting.
struct ForwardFlops {
  double layer_gemm = 0;  // one block's matrix multiplies (QKV, output projection, MLP)
  double layer_attn = 0;  // one block's QKᵀ and attention-times-V products over the full sequence
  double logits = 0;      // the output head
};
ForwardFlops plan_forward_flops_per_token(const PlanModel& m);

const char* ffn_kind_name(FfnKind k);  // "gelu", "swiglu"

}  // namespace gantry
