#include "ui/console/step_log.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace gantry::console {

void StepColumns::push(const StepRecord& r) {
  step.push_back(static_cast<double>(r.step));
  loss.push_back(r.loss);
  grad_norm.push_back(r.grad_norm);
  tokens_per_s.push_back(r.tokens_per_s);
  // Percent, the plot's unit; NaN (a gap, never 0) when the peak is unknown.
  mfu_percent.push_back(r.mfu ? 100 * *r.mfu : std::numeric_limits<double>::quiet_NaN());
  step_s.push_back(r.step_s);
}

void StepColumns::pop() {
  for (std::vector<double>* c : {&step, &loss, &grad_norm, &tokens_per_s, &mfu_percent, &step_s})
    c->pop_back();
}

size_t StepLog::append(std::vector<StepRecord> records) {
  std::sort(records.begin(), records.end(),
            [](const StepRecord& a, const StepRecord& b) { return a.step < b.step; });
  size_t appended = 0;
  for (StepRecord& r : records) {
    const int64_t last = last_step();
    if (r.step <= last) continue;  // already held (an overlap, a retry) or a repeat within this batch
    if (r.step > last + 1) gap_steps_ += r.step - last - 1;
    columns_.push(r);
    records_.push_back(std::move(r));
    ++appended;
  }
  return appended;
}

void StepLog::rewind(int64_t step) {
  while (!records_.empty() && records_.back().step > step) {
    records_.pop_back();
    columns_.pop();
  }
}

}  // namespace gantry::console
