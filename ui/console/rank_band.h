// The band of the Run panel: the chosen rank time (busy by default) across all ranks, min / mean / max per
// bucket of steps, as the coordinator answers GET /v1/runs/{id}/steps?buckets=N&metric=M from its tile
// pyramid ("rank_seconds"). The excess view's band beside it is each bucket's min and max minus its mean
// (its centre line is 0): the tiles keep sums, not medians, so the band's centre is the mean across ranks.
//
//   Result<RankBand> band = rank_band_from_json(api.steps(run, {.buckets = 2000, .metric = "busy"}).value(),
//                                               RankTimeMetric::kBusy);
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "telemetry/status.h"
#include "ui/console/rank_metric.h"

namespace gantry::console {

struct RankBand {
  RankTimeMetric metric = RankTimeMetric::kBusy;
  int64_t run = -1;
  int64_t bucket_steps = 0;
  int64_t last_step = -1;                    // the run's newest step when asked (the band's end)
  std::vector<double> step, min, mean, max;  // per bucket: its first step; buckets with no record left out
  std::vector<double> excess_min, excess_max, zero;  // the excess view: min and max minus the mean; 0
  size_t size() const { return step.size(); }
};

Result<RankBand> rank_band_from_json(const nlohmann::json& steps_answer, RankTimeMetric metric);

}  // namespace gantry::console
