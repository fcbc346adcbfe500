// The history panel's view model: the runs of a local Gantry history file (storage/HistoryDb: the
// console's cache, or `gantry-engine run`'s <out>/history.sqlite), up to two of them selected, and their
// loss curves for an overlay plot. Pure C++ over storage/, no ImGui: history_panel.h draws it.
//
// Curves come from storage's decimated step query (HistoryDb::query_step_band), so a curve holds at most
// about 2 × max_points points whatever the run's length: a run of at most `max_points` steps comes back
// step by step, exactly; a
// longer one as aligned buckets, each drawn as its minimum and its maximum so no loss spike is lost. A
// step whose loss is missing or NaN (a diverged step: stored as NULL) leaves a gap (NaN) in the curve, and
// a curve whose last steps diverged ends with a NaN at the run's last step.
//
//   HistoryModel h;
//   if (Status s = h.open(cache_path); !s.ok()) show(s.message());  // its own read-only connection
//   h.refresh();                      // re-list runs (and re-read the selected curves); not every frame
//   h.toggle(run_a); h.toggle(run_b); // a third selection drops the oldest
//   for (const OverlaySeries& s : h.overlay()) plot(s.name, s.step, s.loss);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/history_db.h"
#include "telemetry/status.h"

namespace gantry::history {

// Runs compared at once by default (set_max_selected changes it): a colour each in the panel.
inline constexpr size_t kMaxSelected = 8;

// What a compared curve's x is: the step, or the seconds since the run's first step record (runs started
// at different times, or at different speeds, side by side).
enum class CompareAxis { kStep, kTime };

// One line of the runs table.
struct HistoryRun {
  int64_t id = 0;
  std::string name;
  double start_unix_s = 0;  // when the run began
  std::string state;        // "running", "finished", "failed", "stopped"
  int64_t last_step = -1;   // the highest step with a step record; -1 = none yet
  double last_loss = 0;     // the loss at last_step (NaN: diverged, or none)
  std::string layout;       // as recorded, e.g. "dp=4 tp=1 pp=1 zero=1"
  int32_t world_size = 1;
};

// One run's curve of the chosen step metric (loss by default) against step, ready for plot::PlotSeries (x
// ascending; NaN = gap).
struct OverlaySeries {
  int64_t run_id = 0;
  std::string name;            // "run 3: gpt2-124m"
  std::vector<double> step;    // x by step
  std::vector<double> loss;    // y: the metric's values (named when loss was the only one)
  std::vector<double> time_s;  // x by time: seconds since the run's first step record, per point
  const std::vector<double>& x(CompareAxis a) const { return a == CompareAxis::kTime ? time_s : step; }
  int64_t bucket_steps = 1;  // 1: every point is one step's loss; > 1: bucket minima and maxima
};

class HistoryModel {
 public:
  HistoryModel();
  ~HistoryModel();
  HistoryModel(const HistoryModel&) = delete;
  HistoryModel& operator=(const HistoryModel&) = delete;

  // Opens the history file read-only, on a connection of the model's own: the writer (the console's
  // network thread, a training process) keeps its own, and WAL lets both go on. Then refreshes.
  Status open(const std::string& path);
  bool is_open() const { return db_ != nullptr; }
  const std::string& path() const { return path_; }

  // Re-reads the runs (newest first) and the selected runs' curves. Selected runs that are gone are
  // dropped. An error leaves the previous lists and is returned (and kept in error()).
  Status refresh();
  const std::vector<HistoryRun>& runs() const { return runs_; }
  const std::string& error() const { return error_; }

  // Selection: at most kMaxSelected runs, in the order chosen. select() of a third run drops the
  // earliest chosen. Each change re-reads the curves. Unknown run ids are refused (false).
  bool select(int64_t run_id);
  void deselect(int64_t run_id);
  bool toggle(int64_t run_id);  // select if not selected, deselect otherwise; false for an unknown run
  void clear_selection();
  bool is_selected(int64_t run_id) const;
  const std::vector<int64_t>& selected() const { return selected_; }

  // The selected runs' curves of the first metric, in selection order; overlay(k) of the k-th metric.
  const std::vector<OverlaySeries>& overlay() const { return overlay_; }
  const std::vector<OverlaySeries>& overlay(size_t metric_index) const {
    return metric_index == 0 ? overlay_ : second_;
  }
  // The metrics compared (each re-reads the curves when it changes): the first, and the second one the
  // panel's linked plot shows.
  void set_metrics(StepMetric first, StepMetric second);
  StepMetric metric(size_t index) const { return index == 0 ? metric_ : metric2_; }
  void set_max_selected(size_t n);
  // The x the curves are read for: by time costs a point lookup per point (the step records' times), so
  // time_s is filled only while the time axis is chosen (else it is empty).
  void set_axis(CompareAxis a);
  CompareAxis axis() const { return axis_; }
  // Points per curve before storage decimates it (buckets of a power-of-two number of steps); a plot
  // passes about its width in pixels. Changing it re-reads the curves.
  void set_max_points(int32_t n);
  int32_t max_points() const { return max_points_; }

 private:
  Status load_curves();
  Status load_metric(StepMetric metric, std::vector<OverlaySeries>* curves);
  const HistoryRun* find(int64_t run_id) const;

  std::unique_ptr<HistoryDb> db_;
  std::string path_;
  std::string error_;
  std::vector<HistoryRun> runs_;
  std::vector<int64_t> selected_;
  std::vector<OverlaySeries> overlay_, second_;
  int32_t max_points_ = 2000;
  size_t max_selected_ = kMaxSelected;
  StepMetric metric_ = StepMetric::loss, metric2_ = StepMetric::grad_norm;
  CompareAxis axis_ = CompareAxis::kStep;
};

// A loss curve from storage's decimated query over [step_begin, step_end), as the model draws it (see the
// header note). Exposed for tests and other panels; false with db.error() on failure.
bool history_loss_curve(HistoryDb& db, int64_t run_id, int32_t max_points, OverlaySeries* out);
// The same for any step metric; with `times`, time_s too (the step records' times, relative to the first).
bool history_step_curve(HistoryDb& db, int64_t run_id, StepMetric metric, int32_t max_points,
                        OverlaySeries* out, bool times = true);

}  // namespace gantry::history
