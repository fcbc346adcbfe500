#include "ui/console/rank_band.h"

#include <cmath>

namespace gantry::console {

RankBand rank_band_from_tile(const HeatTile& t, RankTimeMetric metric) {
  RankBand b;
  b.metric = metric;
  b.bucket_steps = t.bucket_steps;
  b.last_step = t.last_step;
  if (t.rows < 1) return b;
  for (int c = 0; c < t.cols; ++c) {
    const size_t i = static_cast<size_t>(c);  // row 0
    if (std::isnan(t.max[i])) continue;
    const double mn = t.min[i], mx = t.max[i], mean = t.mean[i];
    b.step.push_back(static_cast<double>(t.first_step + c * t.bucket_steps));
    b.min.push_back(mn);
    b.mean.push_back(mean);
    b.max.push_back(mx);
    b.excess_min.push_back(mn - mean);
    b.excess_max.push_back(mx - mean);
    b.zero.push_back(0);
  }
  return b;
}

}  // namespace gantry::console
