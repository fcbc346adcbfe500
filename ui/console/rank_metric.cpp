#include "ui/console/rank_metric.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gantry::console {

std::string_view rank_time_metric_label(RankTimeMetric m) {
  constexpr std::string_view kLabels[kRankTimeMetricCount] = {
      "busy", "total", "data wait", "forward", "backward", "optimizer", "comm (exposed)", "checkpoint stall"};
  return kLabels[static_cast<size_t>(m)];
}

std::string_view rank_time_metric_api_name(RankTimeMetric m) {
  constexpr std::string_view kNames[kRankTimeMetricCount] = {
      "busy", "total", "data_wait", "forward", "backward", "optimizer", "comm_exposed", "checkpoint_stall"};
  return kNames[static_cast<size_t>(m)];
}

double rank_time_value(const RankStepRecord& r, RankTimeMetric m) {
  switch (m) {
    case RankTimeMetric::kBusy:
      return r.phases.data_wait + r.phases.forward + r.phases.backward + r.phases.optimizer;
    case RankTimeMetric::kTotal:
      return r.total_s;
    case RankTimeMetric::kDataWait:
      return r.phases.data_wait;
    case RankTimeMetric::kForward:
      return r.phases.forward;
    case RankTimeMetric::kBackward:
      return r.phases.backward;
    case RankTimeMetric::kOptimizer:
      return r.phases.optimizer;
    case RankTimeMetric::kCommExposed:
      return r.phases.comm_exposed;
    case RankTimeMetric::kCheckpointStall:
      return r.phases.checkpoint_stall;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double excess_over_median(std::span<float> row) {
  std::vector<float> known;
  known.reserve(row.size());
  for (float v : row)
    if (!std::isnan(v)) known.push_back(v);
  const double median = median_in_place(known);
  if (std::isnan(median)) return median;
  for (float& v : row)
    if (!std::isnan(v)) v = static_cast<float>(v - median);
  return median;
}

std::vector<BreakdownRow> breakdown_rows(const std::vector<RankStepRecord>& latest, int world,
                                         RankTimeMetric m) {
  std::vector<BreakdownRow> rows;
  std::vector<float> values;
  for (const RankStepRecord& r : latest) {
    if (r.step <= 0 || r.rank >= world) continue;  // ranks of the current placement that reported a step
    rows.push_back({.record = &r, .value = rank_time_value(r, m)});
    values.push_back(static_cast<float>(rows.back().value));
  }
  const double median = median_in_place(values);
  for (BreakdownRow& row : rows) row.excess = row.value - median;
  std::stable_sort(rows.begin(), rows.end(), [](const BreakdownRow& a, const BreakdownRow& b) {
    if (a.excess != b.excess) return a.excess > b.excess;
    return a.record->rank < b.record->rank;
  });
  return rows;
}

}  // namespace gantry::console
