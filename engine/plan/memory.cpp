#include "engine/plan/memory.h"

#include <algorithm>

#include "telemetry/pipeline_bubble.h"

namespace gantry {

namespace {

// Bytes per element of the (s, b, h) activation, grouped by whether tensor parallelism splits them.
// Korthikanti et al. 2022 §4.1 with bf16 activations (2 bytes) and 1-byte dropout masks.
struct LayerTerms {
  double outside_tp = 0;  // LayerNorm inputs, QKV and MLP inputs, dropout masks: whole on every tp rank
  double inside_tp = 0;   // Q, K, V, projection inputs, MLP inner activations: split by tp
  double attn_core = 0;   // softmax output (and its dropout): the 5as/h term, split by tp
};

LayerTerms layer_terms(const PlanModel& m, bool flash) {
  const double h = m.hidden;
  const double kv = static_cast<double>(plan_model_kv_dim(m)) / h;  // K (and V) width relative to h
  const double f = plan_model_ffn(m) / h;                           // MLP width relative to h
  LayerTerms t;
  // Two norm inputs (2 + 2), the QKV input (2), the MLP input (2); with dropout, the masks after the
  // attention projection and after the MLP (1 + 1). GPT-3: 10.
  t.outside_tp = 4 + 2 + 2 + (m.dropout ? 2 : 0);
  // Q (2), K and V (2·kv each), the projection input (2). GPT-3: 8.
  t.inside_tp = 2 + 2 * kv + 2 * kv + 2;
  if (m.ffn_kind == FfnKind::kGelu) {
    t.inside_tp += 2 * f + 2 * f;  // GELU input and the second matrix's input. GPT-3: 16, total 24.
  } else {
    t.inside_tp += 3 * 2 * f;  // gate and up outputs, the down projection's input
  }
  const double as_h = static_cast<double>(m.heads) * m.seq / h;
  if (flash) {
    // Flash attention keeps only the softmax statistics: one fp32 log-sum-exp per head per token.
    t.attn_core = 4.0 * m.heads / h;
  } else {
    // Softmax output 2as/h; with dropout its mask as/h and its output 2as/h. GPT-3: 5as/h.
    t.attn_core = (m.dropout ? 5.0 : 2.0) * as_h;
  }
  return t;
}

double sbh(const PlanModel& m, const ActivationShape& a) {
  return static_cast<double>(a.micro_batch) * (static_cast<double>(m.seq) / a.cp) * m.hidden;
}

}  // namespace

double plan_activation_layer_bytes(const PlanModel& m, const ActivationShape& a) {
  const double t = a.tp, e = sbh(m, a);
  const bool sp = a.sequence_parallel && a.tp > 1;
  if (a.recompute == Recompute::kFull) {
    // Only the layer input survives (§5): 2sbh, sharded along the sequence with sequence parallelism.
    return 2.0 * e / (sp ? t : 1.0);
  }
  const LayerTerms lt = layer_terms(m, a.flash_attention);
  const double core = a.recompute == Recompute::kSelective ? 0.0 : lt.attn_core;
  return e * (lt.outside_tp / (sp ? t : 1.0) + (lt.inside_tp + core) / t);
}

double plan_activation_recompute_working_bytes(const PlanModel& m, const ActivationShape& a) {
  if (a.recompute != Recompute::kFull) return 0;
  ActivationShape all = a;
  all.recompute = Recompute::kNone;
  return plan_activation_layer_bytes(m, all);
}

double plan_activation_embedding_bytes(const PlanModel& m, const ActivationShape& a) {
  if (!m.dropout) return 0;
  const bool sp = a.sequence_parallel && a.tp > 1;
  return sbh(m, a) / (sp ? a.tp : 1.0);
}

double plan_activation_output_bytes(const PlanModel& m, const ActivationShape& a) {
  const bool sp = a.sequence_parallel && a.tp > 1;
  const double e = sbh(m, a);
  const double logits = 4.0 * a.micro_batch * (static_cast<double>(m.seq) / a.cp) * m.vocab / a.tp;
  return 4.0 * e / (sp ? a.tp : 1.0) + logits;
}

double plan_microbatches_in_flight(Schedule s, int pp, int vp, int micro_batches, int stage) {
  const double m = std::max(1, micro_batches);
  switch (s) {
    case Schedule::kGpipe:
      return m;
    case Schedule::k1F1B:
      return std::min<double>(pp - stage, m);
    case Schedule::kZeroBubbleH1:
      return std::min<double>(pp, m);
    case Schedule::kInterleaved: {
      const double v = std::max(1, vp);
      const double chunks = 2.0 * (pp - 1 - stage) + (v - 1) * pp + 1;
      return std::min(chunks, m * v) / v;
    }
  }
  return m;
}

int plan_bubble_divisor(Schedule s, int vp) {
  if (s == Schedule::kInterleaved) return std::max(1, vp);
  if (s == Schedule::kZeroBubbleH1) return kZeroBubbleH1BubbleDivisor;
  return 1;
}

double plan_bubble_fraction(Schedule s, int pp, int vp, int micro_batches) {
  if (pp <= 1 || micro_batches <= 0) return 0;
  return (pp - 1) / (static_cast<double>(plan_bubble_divisor(s, vp)) * micro_batches);
}

double plan_bubble_step_fraction(Schedule s, int pp, int vp, int micro_batches) {
  if (micro_batches <= 0) return 0;
  return pipeline_bubble_fraction(pp, plan_bubble_divisor(s, vp), micro_batches);
}

}  // namespace gantry
