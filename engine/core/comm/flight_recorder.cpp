#include "engine/core/comm/flight_recorder.h"

#include <algorithm>
#include <chrono>

namespace gantry {
namespace {

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {}

void FlightRecorder::enter(uint64_t seq, const char* op, uint64_t bytes) {
  const int64_t now = unix_ms_now();
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = {
      .seq = seq, .op = op, .bytes = bytes, .entered_unix_ms = now, .left_unix_ms = 0, .ok = true};
  next_ = (next_ + 1) % ring_.size();
  count_ = std::min(count_ + 1, ring_.size());
  open_ = true;
}

void FlightRecorder::leave(bool ok) {
  const int64_t now = unix_ms_now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;
  Entry& e = ring_[(next_ + ring_.size() - 1) % ring_.size()];
  e.left_unix_ms = now;
  e.ok = ok;
  open_ = false;
}

std::vector<CollectiveRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  out.reserve(count_);
  for (size_t k = 0; k < count_; ++k) {
    const Entry& e = ring_[(next_ + ring_.size() - count_ + k) % ring_.size()];
    out.push_back({.seq = e.seq,
                   .op = e.op,
                   .bytes = e.bytes,
                   .entered_unix_ms = e.entered_unix_ms,
                   .left_unix_ms = e.left_unix_ms,
                   .ok = e.ok});
  }
  return out;
}

}  // namespace gantry
