#include "ui/console/rank_band.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gantry::console {

void RankBand::update(const RankStepGrid& g, int world) {
  if (g.rows() < step.size() || (g.rows() > 0 && g.first_step() != first_step_)) *this = RankBand();
  first_step_ = g.first_step();
  for (std::vector<double>* c : {&step, &min, &median, &max, &excess_min, &excess_max, &zero})
    c->resize(final_rows);
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const int want = std::min(std::max(1, world), g.width());
  std::vector<float> values;
  bool still_final = true;
  for (size_t row = final_rows; row < g.rows(); ++row) {
    const float* cells = g.row(row);
    values.clear();
    for (int k = 0; k < g.width(); ++k)
      if (!std::isnan(cells[k])) values.push_back(cells[k]);
    const bool complete = static_cast<int>(values.size()) >= want;
    if (still_final && complete) final_rows = row + 1;
    still_final = still_final && complete;
    step.push_back(static_cast<double>(g.first_step() + static_cast<int64_t>(row)));
    if (values.empty()) {
      for (std::vector<double>* c : {&min, &median, &max, &excess_min, &excess_max, &zero})
        c->push_back(kNaN);
      continue;
    }
    const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
    const double mn = *lo, mx = *hi;
    const double med = median_in_place(values);  // selection, not a sort: O(ranks) per step
    min.push_back(mn);
    max.push_back(mx);
    median.push_back(med);
    excess_min.push_back(mn - med);
    excess_max.push_back(mx - med);
    zero.push_back(0);
  }
}

}  // namespace gantry::console
