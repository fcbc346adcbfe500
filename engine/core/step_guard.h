// The NaN/Inf and loss-spike guard: which steps' updates the train loop skips, and when it gives up.
// A step is skipped when its loss or gradient norm is not finite, or (train.guard_spike_factor > 0) when
// its loss is above factor x the median loss of the last train.guard_window updated steps; after
// train.guard_max_skips_in_row skipped steps in a row the train loop rolls back (train.guard_on_streak,
// engine/core/train.cpp) or stops. The inputs are the gang's globally
// reduced loss and norm (the same bits on every rank), so every rank takes the same decision.
//
//   StepGuard g(c.train);
//   step.max_loss = g.loss_limit();        // the backend skips the update above it (before updating)
//   GuardVerdict v = g.judge(loss, norm);  // after the step: skipped, and why
//   g.record(loss, v.skip);
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/sampler.h"  // SkippedBatches

namespace gantry {

struct GuardVerdict {
  bool skip = false;
  std::string
      reason;  // "loss is nan", "grad norm inf", "loss 9.1 is 4.2x the median 2.17 of the last 20 steps"
};

class StepGuard {
 public:
  StepGuard(double spike_factor, int window, int max_skips_in_row);
  explicit StepGuard(const TrainConfig& t)
      : StepGuard(t.guard_spike_factor, t.guard_window, t.guard_max_skips_in_row) {}

  // The loss above which this step's update must be skipped: factor x the window's median once the window
  // is full, +infinity before that or with the spike check off.
  double loss_limit() const;
  // Whether a step with this (globally reduced) loss and gradient norm is skipped, and the reason.
  GuardVerdict judge(double loss, double grad_norm) const;
  // Counts the step: an updated step's loss joins the window; a skipped one extends the run of skips.
  void record(double loss, bool skipped);

  int skips_in_row() const { return in_row_; }
  int64_t skips_total() const { return total_; }
  // True when the run of skipped steps has reached train.guard_max_skips_in_row.
  bool exhausted() const { return in_row_ >= max_in_row_; }
  int max_skips_in_row() const { return max_in_row_; }

 private:
  double median() const;

  double factor_;
  int window_;
  int max_in_row_;
  std::deque<double> recent_;  // losses of the last window_ updated steps, oldest first
  int in_row_ = 0;
  int64_t total_ = 0;
};

// The step guard rolled back (engine/core/step_guard.h): after `skips` skipped steps in a row ending at
// from_step, the run restored the checkpoint `dir` of step to_step and goes on from there; the data cursor
// passes over the streak's batches (global batch indices, 0-based), which are never read again.
struct GuardRollback {
  int64_t from_step = 0;
  int64_t to_step = 0;
  std::string dir;
  int skips = 0;
  std::vector<SkippedBatches> skipped;  // the streak's batches
  int rollback = 0;                     // 1 for the run's first rollback
  std::string reason;                   // the last skip's reason
};

// "rolled back from step 12 to step 8 (checkpoint …/step_00000008) after 3 skipped steps in a row (the last:
// grad norm nan); batches 9..11 passed over (rollback 1)"; and the event's JSON payload
// {"from_step", "to_step", "dir", "skips", "skipped": [[first, count], ...], "rollback", "reason"}.
std::string guard_rollback_message(const GuardRollback& r);
std::string guard_rollback_payload(const GuardRollback& r);

}  // namespace gantry
