#include "ui/console/stragglers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gantry::console {

std::vector<StragglerRow> straggler_rows(const std::vector<RankView>& ranks) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  double fastest = 0;
  for (const RankView& r : ranks)
    if (r.step_seconds > 0 && (fastest == 0 || r.step_seconds < fastest)) fastest = r.step_seconds;
  std::vector<StragglerRow> rows;
  rows.reserve(ranks.size());
  for (const RankView& r : ranks) {
    StragglerRow row{.rank = r.rank, .node = r.node, .step_seconds = r.step_seconds};
    if (r.score) {
      row.score = *r.score;
      row.individual = r.individual.value_or(kNaN);
      row.flagged = r.flagged.value_or(false);
      row.slow_phase = r.slow_phase;
      row.scored_by_coordinator = true;
    } else {
      // Only the latest step: noisier than the coordinator's windowed medians, so it never flags.
      row.score = (r.step_seconds > 0 && fastest > 0) ? fastest / r.step_seconds : kNaN;
      row.individual = kNaN;
    }
    rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const StragglerRow& a, const StragglerRow& b) {
    if (a.flagged != b.flagged) return a.flagged;
    const bool an = std::isnan(a.score), bn = std::isnan(b.score);
    if (an != bn) return bn;  // known scores before unknown ones
    if (!an && a.score != b.score) return a.score < b.score;
    return a.rank < b.rank;
  });
  return rows;
}

std::vector<std::string> straggler_nodes(const std::vector<StragglerRow>& rows) {
  std::vector<std::string> out;
  for (const StragglerRow& r : rows) {
    if (r.flagged && !r.node.empty() && std::find(out.begin(), out.end(), r.node) == out.end()) out.push_back(r.node);
  }
  return out;
}

}  // namespace gantry::console
