// The idle fraction of an ideal pipeline step, one formula for the engine's schedules
// (engine/core/parallel/pipeline_schedule.h pipeline_schedule_bubble, which the train loop prints beside the
// measured bubble) and the planner's (engine/plan/memory.h plan_bubble_step_fraction): both layers may use
// telemetry, neither the other (DESIGN.md's arrows), so the arithmetic lives here once.
//
// With m micro-batches on p equal stages a stage idles (p − 1) slices of its per-micro-batch work while the
// pipe fills and drains, and works m·k of them: the bubble is (p − 1) / (k·m + p − 1). k is 1 for GPipe and
// 1F1B, vp for interleaved 1F1B (a chunk is 1/vp of the stage), and 3 for ZB-H1 (Qi et al. 2023 §3.1: the
// deferred weight passes fill all but T_F + T_B − T_W of each fill/drain slot, a third of 1F1B's at
// T_F = T_B = T_W).
//
//   double b = pipeline_bubble_fraction(4, kZeroBubbleH1BubbleDivisor, 8);  // 3 / 27
#pragma once

namespace gantry {

// ZB-H1's k above.
inline constexpr int kZeroBubbleH1BubbleDivisor = 3;

// (p − 1) / (k·m + p − 1); 0 for one stage.
inline double pipeline_bubble_fraction(int pp, int k, int m) {
  if (pp <= 1) return 0;
  return static_cast<double>(pp - 1) / (static_cast<double>(k) * m + pp - 1);
}

}  // namespace gantry
