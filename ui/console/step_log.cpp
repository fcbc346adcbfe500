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

void RankStepGrid::widen(int width) {
  if (width <= width_) return;
  // Rare (a rank beyond all seen so far): every chunk is laid out again at the new width.
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (std::shared_ptr<Chunk>& c : chunks_) {
    auto wide = std::make_shared<Chunk>(kRowsPerChunk * static_cast<size_t>(width), kNaN);
    for (size_t r = 0; r < kRowsPerChunk; ++r) {
      std::copy_n(c->data() + r * static_cast<size_t>(width_), width_,
                  wide->data() + r * static_cast<size_t>(width));
    }
    c = std::move(wide);
  }
  width_ = width;
  latest_.resize(static_cast<size_t>(width));
}

float* RankStepGrid::writable_row(size_t index) {
  std::shared_ptr<Chunk>& c = chunks_[index / kRowsPerChunk];
  if (c.use_count() > 1) {
    c = std::make_shared<Chunk>(*c);  // a published snapshot holds it: it stays as it was
  } else {
    // The last other holder let go of it (with a release decrement): see its reads before our writes.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return c->data() + (index % kRowsPerChunk) * static_cast<size_t>(width_);
}

void RankStepGrid::add(const std::vector<RankStepRecord>& records) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (const RankStepRecord& r : records) {
    if (r.rank < 0 || r.step < 1) continue;
    widen(r.rank + 1);
    if (rows_ == 0) first_step_ = r.step;
    if (r.step < first_step_) continue;
    const size_t row = static_cast<size_t>(r.step - first_step_);
    if (row >= rows_) {
      while (chunks_.size() * kRowsPerChunk <= row)
        chunks_.push_back(std::make_shared<Chunk>(kRowsPerChunk * static_cast<size_t>(width_), kNaN));
      rows_ = row + 1;
    }
    writable_row(row)[static_cast<size_t>(r.rank)] = static_cast<float>(rank_time_value(r, metric_));
    RankStepRecord& latest = latest_[static_cast<size_t>(r.rank)];
    if (r.step >= latest.step) latest = r;
  }
}

void RankStepGrid::rewind(int64_t step) {
  if (rows_ == 0 || step >= last_step()) return;
  rows_ = step < first_step_ ? 0 : static_cast<size_t>(step - first_step_ + 1);
  chunks_.resize((rows_ + kRowsPerChunk - 1) / kRowsPerChunk);
  // The kept chunk's rows past the end become unreported again: the steps will be trained anew.
  for (size_t r = rows_; r < chunks_.size() * kRowsPerChunk; ++r) {
    float* cells = writable_row(r);
    std::fill(cells, cells + width_, std::numeric_limits<float>::quiet_NaN());
  }
  complete_rows_ = std::min(complete_rows_, rows_);
  for (RankStepRecord& r : latest_)
    if (r.step > step) r = RankStepRecord{};
}

int64_t RankStepGrid::complete_through(int world) const {
  if (rows_ == 0) return 0;
  const int w = std::min(world, width_);
  if (w < world) return first_step_ - 1;  // some rank has never reported
  if (hint_world_ != world || complete_rows_ > rows_) complete_rows_ = 0;
  hint_world_ = world;
  for (; complete_rows_ < rows_; ++complete_rows_) {
    const float* cells = row(complete_rows_);
    for (int k = 0; k < w; ++k) {
      if (std::isnan(cells[k])) return first_step_ + static_cast<int64_t>(complete_rows_) - 1;
    }
  }
  return last_step();
}

float RankStepGrid::at(int64_t step, int rank) const {
  if (rows_ == 0 || step < first_step_ || step > last_step() || rank < 0 || rank >= width_)
    return std::numeric_limits<float>::quiet_NaN();
  return row(static_cast<size_t>(step - first_step_))[rank];
}

}  // namespace gantry::console
