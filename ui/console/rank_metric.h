// What the Run panel's rank × step heatmap, its min / median / max band and its breakdown table show of each
// rank's step: busy time by default (data wait + forward + backward + optimizer: the time the rank needed
// itself), or the step's total, or one phase, optionally as the excess over the step's median rank.
// In synchronous data parallelism every rank's total is the same (the fast ranks wait for the slow one in
// their collectives, as exposed communication), so a slow rank shows on busy time, not on total.
//
//   float median = excess_over_median(column);              // the heatmap's excess view, in place
//   for (const BreakdownRow& r : breakdown_rows(latest, world, RankTimeMetric::kBusy)) ...  // most excess
//   first
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "telemetry/records.h"

namespace gantry::console {

enum class RankTimeMetric : uint8_t {
  kBusy,
  kTotal,
  kDataWait,
  kForward,
  kBackward,
  kOptimizer,
  kCommExposed,
  kCheckpointStall,
};
inline constexpr int kRankTimeMetricCount = 8;

// "busy", "total", "data wait", "forward", ...: the selector's words.
std::string_view rank_time_metric_label(RankTimeMetric m);
// The coordinator's name for it, as the steps API's metric parameter takes it: "busy", "data_wait", ...
std::string_view rank_time_metric_api_name(RankTimeMetric m);
// The metric's value in a rank's step record, seconds.
double rank_time_value(const RankStepRecord& r, RankTimeMetric m);

// Replaces each value of one heatmap column (a cell per row of ranks, NaN = none) by its excess over the
// median of the reported values, and returns that median (NaN when none is reported).
double excess_over_median(std::span<float> row);

// The median of the values (NaN for none); reorders them. The mean of the two middle values for an even
// count. Selection, not a sort: O(n).
template <class Values>  // a std::vector or std::span of float or double
double median_in_place(Values& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
  double median = v[m];
  if (v.size() % 2 == 0)
    median = 0.5 * (median + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m)));
  return median;
}

// One rank of the breakdown table: its latest step record, that record's value of the metric and its
// excess over the median rank's latest value.
struct BreakdownRow {
  const RankStepRecord* record = nullptr;
  double value = 0;
  double excess = 0;
};
// The latest record of each rank of the current placement (rank < world, a step reported), the most excess
// first, ties in rank order. The pointers point into `latest`.
std::vector<BreakdownRow> breakdown_rows(const std::vector<RankStepRecord>& latest, int world,
                                         RankTimeMetric m);

}  // namespace gantry::console
