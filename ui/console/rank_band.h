// The band of the Run panel: the chosen rank time (busy by default) across all ranks, min / mean / max per
// bucket of steps over the whole run. It is the coordinator's heatmap tile query with one row for all ranks
// (GET /v1/runs/{id}/heatmap?rank_buckets=1&buckets=N: the top of its tile pyramid, so its cost follows
// the buckets), read into a HeatTile and turned into columns for the line plot here. The excess view's
// band beside it is each bucket's min and max minus its mean (its centre line is 0): the tiles keep sums,
// not medians, so the band's centre is the mean across ranks.
//
//   RankBand band = rank_band_from_tile(tile_with_one_row, RankTimeMetric::kBusy);
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ui/console/rank_metric.h"
#include "ui/console/tile_cache.h"

namespace gantry::console {

struct RankBand {
  RankTimeMetric metric = RankTimeMetric::kBusy;
  int64_t run = -1;
  int64_t bucket_steps = 0;
  int64_t last_step = -1;                            // the run's newest step when read (the band's end)
  std::vector<double> step, min, mean, max;          // per bucket: its first step; empty buckets left out
  std::vector<double> excess_min, excess_max, zero;  // the excess view: min and max minus the mean; 0
  size_t size() const { return step.size(); }
};

// Row 0 of `tile` (all ranks when asked with rank_buckets = 1); columns with no record are left out, not
// drawn as 0.
RankBand rank_band_from_tile(const HeatTile& tile, RankTimeMetric metric);

}  // namespace gantry::console
