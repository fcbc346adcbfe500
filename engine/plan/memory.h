// Activation memory and the pipeline's in-flight micro-batches, after Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models": bytes a transformer layer stores for backward
// (§4.1), how tensor and sequence parallelism split them (§4.2.1–4.2.2), what selective
// and full recomputation keep (§5), how many micro-batches the first pipeline stage holds under 1F1B and
// interleaving (§4.2.3), and the embedding/output extras (§4.3). Generalised past GPT-3's shape to
// grouped-query attention, SwiGLU, no dropout and flash attention; with a GPT-3-shaped model, dropout on
// and flash off the formulas reduce to the paper's (tests/engine/plan check the hand-computed cases).
//
//   ActivationShape a{.micro_batch = 1, .tp = 8, .sequence_parallel = true, .recompute =
//   Recompute::kSelective}; double per_layer = plan_activation_layer_bytes(model, a);            // sbh·34/t
//   for GPT-3 with dropout double in_flight = plan_microbatches_in_flight(Schedule::k1F1B, 8, 1, 64, 0);  //
//   p on the first stage
#pragma once

#include "engine/plan/layout.h"
#include "engine/plan/model.h"

namespace gantry {

struct ActivationShape {
  int micro_batch = 1;  // b
  int tp = 1;           // t
  int cp = 1;           // the sequence each rank holds is s/cp
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  bool flash_attention = false;
};

// Bytes one layer keeps for backward per micro-batch (bf16 activations, 1-byte dropout masks).
// GPT-3 shape with dropout, flash off: sbh(34 + 5as/h) with no parallelism; sbh(10 + 24/t + 5as/(ht)) with
// tp; sbh/t·(34 + 5as/h) with tp and sequence parallelism; selective drops the 5as/h term; full keeps the
// layer input, 2sbh (2sbh/t with sequence parallelism).
double plan_activation_layer_bytes(const PlanModel& m, const ActivationShape& a);

// What one layer holds while its backward runs when it was fully recomputed: its whole activation set
// (recompute none) on top of the stored inputs. Zero unless recompute is full.
double plan_activation_recompute_working_bytes(const PlanModel& m, const ActivationShape& a);

// First stage, per micro-batch in flight: the embedding's dropout mask (§4.3: sbh/t with sequence
// parallelism), zero without dropout.
double plan_activation_embedding_bytes(const PlanModel& m, const ActivationShape& a);

// Last stage, per micro-batch in flight (§4.3): the final norm's input 2sbh/t, the output layer's input
// 2sbh/t and the fp32 logits for the cross-entropy 4sbv/t (t divides by sequence parallelism for the first
// two, by the vocabulary split for the logits).
double plan_activation_output_bytes(const PlanModel& m, const ActivationShape& a);

// Micro-batches (in units of the device's whole layer share) whose activations stage `stage` (0-based)
// holds at its peak, with m micro-batches per step:
//   gpipe: m;  1f1b: min(p − stage, m);  zbh1: min(p, m) on every stage (a micro-batch's activations wait
//   for its deferred weight pass, as both Gantry backends' slots do);  interleaved: Megatron's warm-up count
//   of model chunks, min(m·v, 2(p − 1 − stage) + (v − 1)·p + 1), divided by v. For stage 0 and m ≥ p this is
//   1 + (p − 1)/(p·v) times p, i.e. Korthikanti's L·(1 + (p − 1)/(p·m_interleave)) layers.
double plan_microbatches_in_flight(Schedule s, int pp, int vp, int micro_batches, int stage);

// The bubble's divisor k (telemetry/pipeline_bubble.h): 1 for GPipe and 1F1B, v interleaved, 3 for ZB-H1.
int plan_bubble_divisor(Schedule s, int vp);
// Pipeline bubble as a fraction of the ideal step (Narayanan et al. 2021 §2.2): (p − 1)/(k·m), so (p − 1)/m
// for GPipe and 1F1B, (p − 1)/(v·m) interleaved, (p − 1)/(3m) ZB-H1.
double plan_bubble_fraction(Schedule s, int pp, int vp, int micro_batches);
// The same as a fraction of the whole step, (p − 1)/(k·m + p − 1): the engine's formula
// (pipeline_schedule_bubble, through telemetry/pipeline_bubble.h), which a run prints beside its measured
// bubble.
double plan_bubble_step_fraction(Schedule s, int pp, int vp, int micro_batches);

}  // namespace gantry
