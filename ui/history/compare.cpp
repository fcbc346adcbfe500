#include "ui/history/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ui/plot/plot_widget.h"

namespace gantry::history {

std::vector<double> ema_smooth(std::span<const double> y, double weight) {
  const double w = std::clamp(std::isnan(weight) ? 0.0 : weight, 0.0, 0.999);
  std::vector<double> out;
  out.reserve(y.size());
  double last = 0;
  int n = 0;
  for (double v : y) {
    if (!std::isfinite(v)) {
      out.push_back(v);
      continue;
    }
    last = last * w + (1 - w) * v;
    ++n;
    const double debias = w == 0 ? 1 : 1 - std::pow(w, n);
    out.push_back(last / debias);
  }
  return out;
}

std::vector<double> log10_values(std::span<const double> y) {
  std::vector<double> out;
  out.reserve(y.size());
  for (double v : y) out.push_back(v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN());
  return out;
}

void link_x(const plot::PlotView& from, plot::PlotView& to) {
  to.x_min = from.x_min;
  to.x_max = from.x_max;
  to.fit_x = from.fit_x;
  to.follow_latest = from.follow_latest;
  to.follow_width = from.follow_width;
}

}  // namespace gantry::history
