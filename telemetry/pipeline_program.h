// The pipeline schedules' order of work, one step of one rank: which micro-batch's forward or backward of
// which model chunk runs when (GPipe, 1F1B, interleaved 1F1B over vp chunks per rank, ZB-H1), and the
// point-to-point messages placed between them by a simulation of the whole pipeline. Pure arithmetic, the
// same on every rank. The engine's backends execute it (engine/core/parallel/pipeline_schedule.h brings it
// in with the stages' partition and the layout checks); the planner (engine/plan/engine_profile.h) replays
// it to count the activation slots a rank's chunks hold. Both layers may use telemetry, neither the other
// (DESIGN.md's arrows), so the order lives here once, like pipeline_bubble.h's formula.
//
//   std::vector<PipelineAction> a = pipeline_actions(PipelineSchedule::kOneFOneB, pp, stage, m);
//   for (const PipelineStep& s : pipeline_program(PipelineSchedule::kInterleaved, pp, vp, stage, m)) ...
#pragma once

#include <string>
#include <vector>

namespace gantry {

enum class PipelineSchedule {
  kGpipe,        // every micro-batch's forward, then every backward (m activations held)
  kOneFOneB,     // warm-up forwards, then one forward and one backward in turn (at most p held)
  kInterleaved,  // 1F1B over vp chunks per rank (Narayanan et al. 2021): bubble / vp, more p2p
  kZeroBubbleH1  // ZB-H1 (Qi et al. 2023): 1F1B with the weight gradient (W) deferred into the bubble
};
// "gpipe", "1f1b", "interleaved", "zbh1": train.pp_schedule's values.
const char* pipeline_schedule_name(PipelineSchedule s);
bool pipeline_schedule_from_name(const std::string& name, PipelineSchedule* out);

// kForward and kBackward (both gradients) under GPipe, 1F1B and interleaving; ZB-H1 splits the backward
// into kInput (the input gradient, which the previous stage waits for) and kWeight (the weight gradient,
// which nobody waits for).
enum class PipelineOp { kForward, kBackward, kInput, kWeight };
struct PipelineAction {
  PipelineOp op = PipelineOp::kForward;
  int micro = 0;
  int chunk = 0;  // which of the rank's vp chunks (0 unless interleaved)
};
// Stage `stage`'s actions for one step of `m` micro-batches. Each chunk's backward (and weight) passes run
// in micro-batch order under every schedule, so a stage adds its gradients in the order one process adds
// them.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int pp, int stage, int m, int vp = 1);
// Activations a stage holds at once under its actions (freed by kBackward or kWeight).
int pipeline_in_flight(const std::vector<PipelineAction>& actions);

// Seconds (or any one unit) of one micro-batch's pass, per virtual stage (chunk c of rank r is stage
// c·pp + r): what a program's messages can be placed by (pipeline_program) and what it is timed with
// (pipeline_program_timing).
struct PipelineCosts {
  std::vector<double> forward, backward;  // backward: both gradients (GPipe, 1F1B, interleaved)
  std::vector<double> input, weight;      // ZB-H1's split backward (its input + weight = backward)
  double transfer_s = 0;                  // one activation or gradient between neighbouring stages
};
struct PipelineStep {
  enum class Kind { kCompute, kSend, kRecv };
  Kind kind = Kind::kCompute;
  PipelineAction action;  // kCompute: what to run; kSend/kRecv: the chunk and micro-batch of this rank
  bool grad = false;      // kSend/kRecv: a gradient going up (else an activation going down)
  int peer = -1;          // kSend/kRecv: the other rank
};
// A rank's program for one step: its actions with the point-to-point messages placed between them. The
// messages are ordered by a simulation of the whole pipeline, with `place`'s costs or, without them, unit
// costs (a forward, an input gradient, a weight gradient 1 each; a whole backward 2), and every rank's
// messages come in that one global order; a send returns when its peer has taken the data
// (engine/core/comm/communicator.h), and a rank only waits on the globally earliest message it is part
// of, so no order of arrival deadlocks, whatever the costs (every rank must place by the same ones). A
// receive goes before the first compute the simulation starts after its message was sent: where the
// costs are the passes' own, that is where the data is there, and a receive placed by units can stall a
// stream before a compute that does not need it (ZB-H1's input pass costs more than a forward on the GPU).
// The costs move messages only: each rank's computes keep pipeline_actions' order. The caller checks the
// layout first (pipeline_check: interleaving needs m a multiple of pp): a schedule whose ranks' orders
// cannot all finish throws std::logic_error naming it (a bug here, never the input's); costs of the
// wrong shape throw std::invalid_argument.
std::vector<PipelineStep> pipeline_program(PipelineSchedule s, int pp, int vp, int stage, int m,
                                           const PipelineCosts* place = nullptr);
// The activation slots a rank's chunks hold running `program` (stage `stage`'s, vp chunks, m micro-batches),
// as both backends take and free them: a chunk's slot taken at an activation's receive, or at the forward on
// the model's first chunk; freed at the gradient's send, or at the first chunk's backward (it sends
// nothing), under ZB-H1 (`split`) at the weight pass instead; a new one only when all of the chunk's are
// busy. The slots are kept for the run, so a step never holds more than the most any program it ran needed.
std::vector<int> pipeline_program_slots(const std::vector<PipelineStep>& program, int stage, int vp, int m,
                                        bool split);
// Whether placing by `costs` leaves every rank's chunks holding no more slots than placing by units (the
// count the planner's memory is built on): a receive placed earlier takes its slot earlier.
bool pipeline_placement_keeps_slots(PipelineSchedule s, int pp, int vp, int m, const PipelineCosts& costs);
// The idle fraction the same simulation gives (makespan − busy time) / makespan, equal on every rank.
double pipeline_simulated_bubble(PipelineSchedule s, int pp, int vp, int m);

// What one step of the programs takes when the passes cost what they cost: every rank runs its program in
// order on one stream (as the CUDA backend does), a compute as soon as the one before it ends; a send takes
// `transfer_s` of its rank and does not wait for the receiver (NCCL's p2p buffers take the activation: the
// CUDA stage's measured waits are this model's, docs/PERF.md call P1, where a send that waits for its
// receive would leave the interleaved ranks taking turns, +18 %), and a receive waits until its data has
// arrived. The messages are placed by these costs (as the CUDA stage places them by its measured ones) or,
// with `place_by_costs` false, by units as before that (docs/PERF.md call U4), where unequal stages or an
// input pass that costs more than a forward made ranks wait where the formula has them working. The
// planner prices gantry-cuda's pipelines with it (engine/plan/planner.cpp).
struct PipelineTiming {
  double makespan = 0;        // the first pass's start to the last rank's end
  std::vector<double> busy;   // [rank] seconds computing
  std::vector<double> waits;  // [rank] seconds sending or waiting for a receive
};
PipelineTiming pipeline_program_timing(PipelineSchedule s, int pp, int vp, int m, const PipelineCosts& costs,
                                       bool place_by_costs = true);

}  // namespace gantry
