#include "engine/core/step_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace gantry {

namespace {

std::string nonfinite_text(double v) {
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

}  // namespace

StepGuard::StepGuard(double spike_factor, int window, int max_skips_in_row)
    : factor_(spike_factor), window_(std::max(1, window)), max_in_row_(std::max(1, max_skips_in_row)) {}

double StepGuard::median() const {
  std::vector<double> v(recent_.begin(), recent_.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double StepGuard::loss_limit() const {
  if (factor_ <= 0 || recent_.size() < static_cast<size_t>(window_))
    return std::numeric_limits<double>::infinity();
  return factor_ * median();
}

GuardVerdict StepGuard::judge(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return {true, "loss is " + nonfinite_text(loss)};
  if (!std::isfinite(grad_norm)) return {true, "grad norm " + nonfinite_text(grad_norm)};
  // The same comparison the backend makes against loss_limit(), so the two never disagree.
  if (loss > loss_limit()) {
    const double med = median();
    char buf[160];
    std::snprintf(buf, sizeof buf, "loss %.4g is %.3gx the median %.4g of the last %d steps", loss,
                  loss / med, med, window_);
    return {true, buf};
  }
  return {};
}

void StepGuard::record(double loss, bool skipped) {
  if (skipped) {
    ++in_row_;
    ++total_;
    return;
  }
  in_row_ = 0;
  recent_.push_back(loss);
  if (recent_.size() > static_cast<size_t>(window_)) recent_.pop_front();
}

}  // namespace gantry
