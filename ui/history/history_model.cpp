#include "ui/history/history_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gantry::history {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The run's newest step record, without reading the whole steps table: the run row knows its newest
// rank-step, and step records end there or a little past it; only a run without rank-step records (or
// with steps far ahead of them) pays for the full decimated pass.
bool newest_step(HistoryDb& db, const RunRow& row, int64_t* step, double* loss) {
  *step = -1;
  *loss = kNaN;
  constexpr size_t kAhead = 64;
  std::vector<StepRecord> tail;
  if (row.last_step >= 0) {
    if (!db.read_steps(row.id, row.last_step, kStepEnd, kAhead, &tail)) return false;
    if (!tail.empty() && tail.size() < kAhead) {
      *step = tail.back().step;
      *loss = tail.back().loss;
      return true;
    }
  }
  // One bucket over every step: its last_step is the newest step with a loss (NULL losses are skipped),
  // and any step records after it (diverged steps) are read directly.
  BandResult band;
  if (!db.query_step_band(row.id, StepMetric::loss, 0, kStepEnd, 1, &band)) return false;
  const int64_t from = band.buckets.empty() ? 0 : band.buckets.back().last_step;
  if (!band.buckets.empty()) {
    *step = band.buckets.back().last_step;
    *loss = band.buckets.back().last;
  }
  for (;;) {
    if (!db.read_steps(row.id, *step < 0 ? from : *step + 1, kStepEnd, 4096, &tail)) return false;
    if (tail.empty()) return true;
    *step = tail.back().step;
    *loss = tail.back().loss;
  }
}

}  // namespace

bool history_loss_curve(HistoryDb& db, int64_t run_id, int32_t max_points, OverlaySeries* out) {
  return history_step_curve(db, run_id, StepMetric::loss, max_points, out);
}

// Each point's time: the step record at its step, or the next one there is (a gap's point), relative to the
// run's first step record. Point lookups on the steps table's key: about 2 × max_points per curve.
bool fill_times(HistoryDb& db, int64_t run_id, OverlaySeries* out) {
  out->time_s.clear();
  std::vector<StepRecord> rec;
  if (!db.read_steps(run_id, 0, kStepEnd, 1, &rec)) return false;
  if (rec.empty()) {
    out->time_s.assign(out->step.size(), kNaN);
    return true;
  }
  const double t0 = rec.front().time_unix_s;
  double last = 0;
  for (double step : out->step) {
    if (!db.read_steps(run_id, static_cast<int64_t>(step), kStepEnd, 1, &rec)) return false;
    // Past the last record (a NaN closing the curve): the newest time, so x still ascends.
    const double t = rec.empty() ? last : std::max(last, rec.front().time_unix_s - t0);
    out->time_s.push_back(t);
    last = t;
  }
  return true;
}

bool history_step_curve(HistoryDb& db, int64_t run_id, StepMetric metric, int32_t max_points,
                        OverlaySeries* out, bool times) {
  BandResult band;
  if (!db.query_step_band(run_id, metric, 0, kStepEnd, std::max<int32_t>(1, max_points), &band)) {
    return false;
  }
  out->run_id = run_id;
  out->step.clear();
  out->loss.clear();
  const int64_t w = std::max<int64_t>(1, band.bucket_steps);
  out->bucket_steps = w;
  const size_t per_bucket = w == 1 ? 1 : 2;
  out->step.reserve(band.buckets.size() * (per_bucket + 1));
  out->loss.reserve(band.buckets.size() * (per_bucket + 1));
  for (size_t i = 0; i < band.buckets.size(); ++i) {
    const Bucket& b = band.buckets[i];
    // Buckets without a loss are left out by the query: the line must not bridge them as if nothing
    // happened there, so a NaN at the first missing step breaks it (plot_lines draws NaN as a gap).
    if (i > 0 && b.step_begin > band.buckets[i - 1].step_begin + w) {
      out->step.push_back(static_cast<double>(band.buckets[i - 1].step_begin + w));
      out->loss.push_back(kNaN);
    }
    if (w == 1) {
      out->step.push_back(static_cast<double>(b.step_begin));
      out->loss.push_back(b.min);  // one step: min = max = its loss
      continue;
    }
    // Both extremes, so a spike survives; the one nearer the bucket's last value second, so the line
    // leaves the bucket where the curve went on.
    const bool max_last = std::fabs(b.last - b.max) <= std::fabs(b.last - b.min);
    out->step.push_back(static_cast<double>(b.step_begin));
    out->loss.push_back(max_last ? b.min : b.max);
    out->step.push_back(static_cast<double>(b.step_begin + w / 2));
    out->loss.push_back(max_last ? b.max : b.min);
  }
  out->time_s.clear();
  return !times || fill_times(db, run_id, out);
}

HistoryModel::HistoryModel() = default;
HistoryModel::~HistoryModel() = default;

Status HistoryModel::open(const std::string& path) {
  std::string why;
  HistoryDbOptions o;
  o.read_only = true;
  o.background_checkpoint = false;
  std::unique_ptr<HistoryDb> db = HistoryDb::open(path, o, &why);
  if (!db) {
    error_ = "cannot open the history " + path + ": " + why;
    return Status::error(error_);
  }
  db_ = std::move(db);
  path_ = path;
  runs_.clear();
  selected_.clear();
  overlay_.clear();
  return refresh();
}

Status HistoryModel::refresh() {
  if (!db_) return Status::error(error_ = "no history is open");
  std::vector<RunRow> rows;
  if (!db_->list_runs(&rows)) return Status::error(error_ = "listing runs: " + db_->error());
  std::vector<HistoryRun> runs;
  runs.reserve(rows.size());
  for (auto it = rows.rbegin(); it != rows.rend(); ++it) {  // newest first
    const RunRow& r = *it;
    HistoryRun& h = runs.emplace_back();
    h.id = r.id;
    h.name = r.info.name;
    h.start_unix_s = r.info.created_unix_s;
    h.state = std::string(run_status_name(r.status));
    h.layout = r.info.layout;
    h.world_size = r.info.world_size;
    if (!newest_step(*db_, r, &h.last_step, &h.last_loss)) {
      return Status::error(error_ = "reading run " + std::to_string(r.id) + ": " + db_->error());
    }
  }
  runs_ = std::move(runs);
  std::erase_if(selected_, [&](int64_t id) { return find(id) == nullptr; });
  error_.clear();
  return load_curves();
}

const HistoryRun* HistoryModel::find(int64_t run_id) const {
  for (const HistoryRun& r : runs_) {
    if (r.id == run_id) return &r;
  }
  return nullptr;
}

bool HistoryModel::is_selected(int64_t run_id) const {
  return std::find(selected_.begin(), selected_.end(), run_id) != selected_.end();
}

bool HistoryModel::select(int64_t run_id) {
  if (find(run_id) == nullptr) return false;
  if (is_selected(run_id)) return true;
  if (selected_.size() >= max_selected_) selected_.erase(selected_.begin());
  selected_.push_back(run_id);
  load_curves();
  return true;
}

void HistoryModel::deselect(int64_t run_id) {
  const size_t before = selected_.size();
  std::erase(selected_, run_id);
  if (selected_.size() != before) load_curves();
}

bool HistoryModel::toggle(int64_t run_id) {
  if (is_selected(run_id)) {
    deselect(run_id);
    return true;
  }
  return select(run_id);
}

void HistoryModel::clear_selection() {
  selected_.clear();
  overlay_.clear();
  second_.clear();
}

void HistoryModel::set_max_selected(size_t n) {
  max_selected_ = std::max<size_t>(1, n);
  if (selected_.size() > max_selected_)
    selected_.erase(selected_.begin(),
                    selected_.begin() + static_cast<ptrdiff_t>(selected_.size() - max_selected_));
  load_curves();
}

void HistoryModel::set_axis(CompareAxis a) {
  if (a == axis_) return;
  axis_ = a;
  load_curves();
}

void HistoryModel::set_metrics(StepMetric first, StepMetric second) {
  if (first == metric_ && second == metric2_) return;
  metric_ = first;
  metric2_ = second;
  load_curves();
}

void HistoryModel::set_max_points(int32_t n) {
  n = std::max<int32_t>(1, n);
  if (n == max_points_) return;
  max_points_ = n;
  load_curves();
}

Status HistoryModel::load_curves() {
  overlay_.clear();
  second_.clear();
  if (!db_) return {};
  for (int k = 0; k < 2; ++k) {
    if (Status st = load_metric(k == 0 ? metric_ : metric2_, k == 0 ? &overlay_ : &second_); !st.ok())
      return st;
  }
  return {};
}

Status HistoryModel::load_metric(StepMetric metric, std::vector<OverlaySeries>* curves) {
  for (int64_t id : selected_) {
    OverlaySeries s;
    if (!history_step_curve(*db_, id, metric, max_points_, &s, axis_ == CompareAxis::kTime)) {
      return Status::error(error_ = "reading the " + std::string(step_metric_name(metric)) + " of run " +
                                    std::to_string(id) + ": " + db_->error());
    }
    const HistoryRun* r = find(id);
    // Steps after the last loss (diverged ones, stored as NULL) still belong to the run: a NaN at its last
    // step carries the x range there without drawing anything.
    if (r != nullptr && r->last_step >= 0 &&
        (s.step.empty() || s.step.back() < static_cast<double>(r->last_step))) {
      s.step.push_back(static_cast<double>(r->last_step));
      s.loss.push_back(kNaN);
      if (axis_ == CompareAxis::kTime) s.time_s.push_back(s.time_s.empty() ? 0 : s.time_s.back());
    }
    s.name = "run " + std::to_string(id) + (r != nullptr && !r->name.empty() ? ": " + r->name : "");
    curves->push_back(std::move(s));
  }
  return {};
}

}  // namespace gantry::history
