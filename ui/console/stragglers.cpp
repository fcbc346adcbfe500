#include "ui/console/stragglers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "telemetry/straggler.h"     // straggler_excess_text: the words `ctl ranks` prints
#include "ui/console/rank_metric.h"  // median_in_place

namespace gantry::console {
namespace {

double median_of(std::vector<double> v) {
  return median_in_place(v);
}

}  // namespace

std::vector<StragglerRow> straggler_rows(const std::vector<RankView>& ranks) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  // The fallback's basis: busy time where the coordinator gives it (every rank's step time is the same in a
  // synchronous job), else the step time of an older coordinator.
  const bool have_busy =
      std::any_of(ranks.begin(), ranks.end(), [](const RankView& r) { return r.busy_seconds > 0; });
  const auto basis = [&](const RankView& r) { return have_busy ? r.busy_seconds : r.step_seconds; };
  double fastest = 0;
  std::vector<double> known;
  for (const RankView& r : ranks) {
    const double b = basis(r);
    if (b <= 0) continue;
    known.push_back(b);
    if (fastest == 0 || b < fastest) fastest = b;
  }
  const double median = median_of(std::move(known));
  std::vector<StragglerRow> rows;
  rows.reserve(ranks.size());
  for (const RankView& r : ranks) {
    StragglerRow row{
        .rank = r.rank, .node = r.node, .step_seconds = r.step_seconds, .busy_seconds = r.busy_seconds};
    const double b = basis(r);
    row.excess_s = b > 0 ? b - median : kNaN;
    if (r.score) {
      row.score = *r.score;
      row.individual = r.individual.value_or(kNaN);
      row.flagged = r.flagged.value_or(false);
      row.slow_phase = r.slow_phase;
      row.scored_by_coordinator = true;
      if (r.excess_s) row.excess_s = *r.excess_s;  // over the scoring window, not one step
    } else {
      // Only the latest step: noisier than the coordinator's windowed medians, so it never flags.
      row.score = (b > 0 && fastest > 0) ? fastest / b : kNaN;
      row.individual = kNaN;
    }
    row.excess = !r.excess.empty() ? r.excess
                                   : (std::isnan(row.excess_s)
                                          ? std::string("-")
                                          : straggler_excess_text(have_busy ? "busy" : "step", row.excess_s));
    rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const StragglerRow& a, const StragglerRow& b) {
    if (a.flagged != b.flagged) return a.flagged;
    const bool an = std::isnan(a.excess_s), bn = std::isnan(b.excess_s);
    if (an != bn) return bn;  // known excess before unknown
    if (!an && a.excess_s != b.excess_s) return a.excess_s > b.excess_s;
    return a.rank < b.rank;
  });
  return rows;
}

std::vector<std::string> straggler_nodes(const std::vector<StragglerRow>& rows) {
  std::vector<std::string> out;
  for (const StragglerRow& r : rows) {
    if (r.flagged && !r.node.empty() && std::find(out.begin(), out.end(), r.node) == out.end())
      out.push_back(r.node);
  }
  return out;
}

}  // namespace gantry::console
