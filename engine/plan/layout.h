// How a training job is spread over GPUs, as the planner sees it: tensor, context, pipeline (with virtual
// stages) and data parallel degrees, ZeRO stage and HSDP shard group, sequence parallelism, activation
// recomputation, flash attention, the pipeline schedule and the micro-batch.
// Rank order (DESIGN.md's, with context parallel next to tensor parallel so its ring stays on NVLink
// when it can): tp innermost, then cp, then pp, then dp outermost.
//
//   PlanLayout l{.tp = 8, .pp = 16, .vp = 2, .zero = 1, .recompute = Recompute::kSelective};
#pragma once

#include <string_view>

#include "telemetry/status.h"

namespace gantry {

enum class Recompute {
  kNone,       // keep every activation backward needs
  kSelective,  // recompute the attention core (Korthikanti et al. 2022 §5), keep the rest
  kFull,       // keep only each layer's input, recompute the layer in backward
};
const char* recompute_name(Recompute r);  // "none", "selective", "full"
Result<Recompute> recompute_parse(std::string_view s);

enum class Schedule {
  kGpipe,        // all forwards, then all backwards: every micro-batch in flight
  k1F1B,         // PipeDream-Flush: at most p micro-batches in flight on the first stage
  kInterleaved,  // 1F1B over vp model chunks per device (Narayanan et al. 2021 §2.2.2)
  // ZB-H1 (Qi et al. 2023): 1F1B with each backward split into the input gradient and the weight gradient,
  // the weight passes deferred into the drain; vp 1. Both Gantry backends run it (train.pp_schedule "zbh1").
  kZeroBubbleH1,
};
const char* schedule_name(Schedule s);  // "gpipe", "1f1b", "interleaved", "zbh1"
// "gpipe", "1f1b", "zbh1" (interleaved comes from vp > 1); the error names the allowed ones.
Result<Schedule> schedule_parse(std::string_view s);

struct PlanLayout {
  int tp = 1;    // tensor parallel
  int pp = 1;    // pipeline stages (devices per pipeline)
  int vp = 1;    // virtual stages (model chunks) per device; > 1 means the interleaved schedule
  int dp = 0;    // data parallel; 0 = gpus / (tp·cp·pp)
  int cp = 1;    // context parallel: the sequence split over cp ranks (ring attention)
  int zero = 0;  // 0 none, 1 optimizer state, 2 + gradients, 3 + weights sharded over the shard group
  int hsdp = 0;  // ZeRO shard group size inside dp (HSDP); 0 = all of dp. Replicas = dp / hsdp.
  bool sequence_parallel =
      true;  // with tp > 1: split norms and dropout along the sequence (Korthikanti §4.2.2)
  Recompute recompute = Recompute::kNone;
  bool flash_attention = true;          // attention scores never stored (and recomputed in backward)
  Schedule schedule = Schedule::k1F1B;  // gpipe, 1f1b or zbh1 (vp 1); becomes interleaved when vp > 1
  int micro_batch = 1;                  // sequences per forward/backward
};

}  // namespace gantry
