// The console's in-memory copy of a run's history: the job's step records in step order, and every rank's
// step time in a rank × step grid. Both are fed by the network thread with whatever the API answered for
// "steps after N", which may overlap what is already held (a retry, a reconnect, a second request racing
// the first) or arrive out of order; these classes make that safe: a step is appended once, in order, and
// a rank's cell is written once per step however often it is sent.
//
//   StepLog log;
//   log.append(records_from_api);               // steps <= last_step() are skipped, the rest sorted in
//   next_query_after = log.last_step();         // "after=N" resumes exactly where the log ends
//
//   RankStepGrid grid(RankTimeMetric::kBusy);
//   grid.add(rank_records);
//   grid.complete_through(4);                   // every rank has reported each step up to here
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "telemetry/records.h"
#include "ui/console/rank_metric.h"

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

// One time metric (rank_metric.h: busy by default) of every rank at every step seen, as float rows of
// `width()` ranks starting at first_step(); a cell not reported yet is NaN. Also keeps each rank's latest
// record (temperature, clock, phases) for the cluster grid, the breakdown and the straggler scores.
//
// Rows live in chunks of kRowsPerChunk, each shared between copies until one of them writes it: a copy of the
// grid (a published snapshot) costs a pointer per chunk, not the grid (0.4 GB at 1,024 ranks × 100,000
// steps), and a live run's new rows copy at most the chunk they land in.
class RankStepGrid {
 public:
  static constexpr size_t kRowsPerChunk = 256;

  explicit RankStepGrid(RankTimeMetric metric = RankTimeMetric::kBusy) : metric_(metric) {}
  RankTimeMetric metric() const { return metric_; }

  // Writes each record's cell (a repeat overwrites with the same value). Records at steps before
  // first_step() are dropped once the grid has rows (a late record of a step already scrolled past).
  void add(const std::vector<RankStepRecord>& records);
  // Drops rows after `step` (see StepLog::rewind).
  void rewind(int64_t step);

  // The highest step S such that every step from first_step() to S has a cell for each rank < world;
  // first_step() - 1 when the first row is incomplete, 0 when there are no rows.
  int64_t complete_through(int world) const;

  int64_t first_step() const { return first_step_; }
  int64_t last_step() const { return rows_ == 0 ? 0 : first_step_ + static_cast<int64_t>(rows_) - 1; }
  size_t rows() const { return rows_; }
  int width() const { return width_; }
  // NaN when not reported.
  float at(int64_t step, int rank) const;
  const float* row(size_t index) const {
    return chunks_[index / kRowsPerChunk]->data() + (index % kRowsPerChunk) * static_cast<size_t>(width_);
  }
  const std::vector<RankStepRecord>& latest() const { return latest_; }  // indexed by rank; step 0 = none
  // The chunks' storage, for tests of the sharing: equal pointers in two grids are one chunk.
  size_t chunks() const { return chunks_.size(); }
  const float* chunk_data(size_t i) const { return chunks_[i]->data(); }

 private:
  using Chunk = std::vector<float>;  // kRowsPerChunk × width_, row-major; NaN where not reported
  void widen(int width);
  float* writable_row(size_t index);  // copies the row's chunk first if another grid shares it
  RankTimeMetric metric_;
  int64_t first_step_ = 0;
  size_t rows_ = 0;
  int width_ = 0;
  std::vector<std::shared_ptr<Chunk>> chunks_;
  std::vector<RankStepRecord> latest_;
  // Rows known complete for hint_world_ ranks: cells are only ever filled, so a scan resumes here.
  mutable size_t complete_rows_ = 0;
  mutable int hint_world_ = -1;
};

}  // namespace gantry::console
