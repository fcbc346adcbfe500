#include "ui/console/rank_band.h"

namespace gantry::console {

Result<RankBand> rank_band_from_json(const nlohmann::json& j, RankTimeMetric metric) {
  RankBand b;
  b.metric = metric;
  try {
    b.bucket_steps = j.at("bucket_steps").get<int64_t>();
    for (const nlohmann::json& k : j.at("rank_seconds")) {
      const double mn = k.at("min").get<double>(), mx = k.at("max").get<double>(),
                   mean = k.at("mean").get<double>();
      b.step.push_back(static_cast<double>(k.at("step_begin").get<int64_t>()));
      b.min.push_back(mn);
      b.mean.push_back(mean);
      b.max.push_back(mx);
      b.excess_min.push_back(mn - mean);
      b.excess_max.push_back(mx - mean);
      b.zero.push_back(0);
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("band: malformed answer: ") + e.what());
  }
  return b;
}

}  // namespace gantry::console
