#include "engine/core/step_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>  // guard_rollback_payload
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

std::string guard_rollback_message(const GuardRollback& r) {
  std::string batches;
  for (const SkippedBatches& b : r.skipped) {
    if (!batches.empty()) batches += ", ";
    batches += std::to_string(b.first);
    if (b.count > 1) batches += ".." + std::to_string(b.first + b.count - 1);
  }
  return "rolled back from step " + std::to_string(r.from_step) + " to step " + std::to_string(r.to_step) +
         " (checkpoint " + r.dir + ") after " + std::to_string(r.skips) +
         " skipped steps in a row (the last: " + r.reason + "); batches " + batches +
         " passed over (rollback " + std::to_string(r.rollback) + ")";
}

std::string guard_rollback_payload(const GuardRollback& r) {
  nlohmann::json skipped = nlohmann::json::array();
  for (const SkippedBatches& b : r.skipped) skipped.push_back({b.first, b.count});
  return nlohmann::json{{"from_step", r.from_step}, {"to_step", r.to_step}, {"dir", r.dir},
                        {"skips", r.skips},         {"skipped", skipped},   {"rollback", r.rollback},
                        {"reason", r.reason}}
      .dump();
}

}  // namespace gantry
