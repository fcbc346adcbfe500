// The console's in-memory copy of a run's step records (the job's, one per step) in step order, fed by the
// network thread with whatever the API answered for "steps after N", which may overlap what is already
// held (a retry, a reconnect, a second request racing the first) or arrive out of order; the log makes
// that safe: a step is appended once, in order. (The ranks' times are not kept per step: the heatmap and
// the band come from the coordinator's tile queries, tile_cache.h and rank_band.h.)
//
//   StepLog log;
//   log.append(records_from_api);               // steps <= last_step() are skipped, the rest sorted in
//   next_query_after = log.last_step();         // "after=N" resumes exactly where the log ends
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "telemetry/records.h"

namespace gantry::console {

// The step records as columns of doubles, ready for the plot widget (x = step). mfu_percent is MFU × 100,
// NaN where the record has none (the device's peak is unknown), which the plot leaves as a gap.
struct StepColumns {
  std::vector<double> step, loss, grad_norm, tokens_per_s, mfu_percent, step_s;
  void push(const StepRecord& r);
  void pop();
  size_t size() const { return step.size(); }
};

class StepLog {
 public:
  // Appends the records whose step is past last_step(), in step order, each step once. Returns how many
  // were appended. A step beyond last_step() + 1 is appended too (the server has nothing in between; a
  // resumed run can start past step 1), and the missing steps are counted in gap_steps().
  size_t append(std::vector<StepRecord> records);
  // The server forgot everything after `step` (a run resumed from an earlier checkpoint): drop it here too
  // so that the steps trained again are appended.
  void rewind(int64_t step);

  int64_t last_step() const { return records_.empty() ? 0 : records_.back().step; }
  const std::vector<StepRecord>& records() const { return records_; }
  size_t size() const { return records_.size(); }
  int64_t gap_steps() const { return gap_steps_; }
  const StepColumns& columns() const { return columns_; }

 private:
  std::vector<StepRecord> records_;
  StepColumns columns_;
  int64_t gap_steps_ = 0;
};

}  // namespace gantry::console
