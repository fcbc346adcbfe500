#include "engine/core/checkpoint_async.h"

#include <chrono>
#include <exception>
#include <utility>

#include "engine/core/fatal.h"  // FatalError, one of what the writer catches

namespace gantry {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(std::string root, Backend& backend, int keep, CheckpointGang* gang,
                                     CheckpointHook hook, SnapshotSlot slot)
    : root_(std::move(root)),
      backend_(backend),
      keep_(keep),
      gang_(gang),
      hook_(std::move(hook)),
      slot_(slot) {
  if (gang_ != nullptr) {
    gang_->poll_store = true;
    gang_->cancel = &cancel_;
  }
}

AsyncCheckpointer::~AsyncCheckpointer() {
  cancel_.store(true);
  if (thread_.joinable()) thread_.join();
  if (gang_ != nullptr) gang_->cancel = nullptr;
}

void AsyncCheckpointer::reserve() {
  backend_.snapshot_memory(slot_, checkpoint_snapshot_pieces(backend_).floats);
}

Result<double> AsyncCheckpointer::start(const CheckpointMeta& meta, double waited_s, bool from_action) {
  if (thread_.joinable())
    return Status::error("checkpoint step " + std::to_string(meta.step) + ": a write is still in flight");
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointSnapshot snapshot = checkpoint_snapshot_pieces(backend_);
  float* host = backend_.snapshot_memory(slot_, snapshot.floats);
  backend_.snapshot_start(slot_, snapshot.pieces, host);
  snapshot.host = host;
  if (hook_) hook_(CheckpointStage::kCopy, meta.step);  // the copy may not have ended (CUDA)
  const double stall = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = false;
    outcome_.reset();
    pending_ = CheckpointDone{.step = meta.step,
                              .async = true,
                              .stall_s = stall + waited_s,
                              .waited_s = waited_s,
                              .from_action = from_action};
  }
  thread_ = std::thread(&AsyncCheckpointer::write, this, meta, std::move(snapshot));
  return stall;
}

void AsyncCheckpointer::write(CheckpointMeta meta, CheckpointSnapshot snapshot) {
  const auto t0 = std::chrono::steady_clock::now();
  Result<CheckpointWritten> w =
      Status::error("checkpoint step " + std::to_string(meta.step) + ": not written");
  std::optional<double> copy_s;
  try {
    backend_.snapshot_wait(slot_);
    copy_s = backend_.snapshot_copy_seconds(slot_);
    w = checkpoint_write_snapshot(root_, backend_.params(), snapshot, meta, keep_, gang_, hook_);
  } catch (const std::exception& e) {
    // A device error while the copy ends (FatalError), or anything else thrown: the write fails, as it
    // would in the loop's own thread, rather than ending the process from this one.
    w = Status::error("checkpoint step " + std::to_string(meta.step) + ": " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (w.ok()) {
    CheckpointDone d = pending_;
    d.written = w.value();
    d.write_s = seconds_since(t0);
    d.copy_s = copy_s;
    outcome_ = Result<CheckpointDone>(d);
  } else {
    outcome_ = Result<CheckpointDone>(w.status());
  }
  done_ = true;
  done_cv_.notify_all();
}

std::optional<Result<CheckpointDone>> AsyncCheckpointer::finished(bool wait) {
  if (!thread_.joinable()) return std::nullopt;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_ && !wait) return std::nullopt;
    done_cv_.wait(lock, [&] { return done_; });
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Result<CheckpointDone>> out = std::move(outcome_);
  outcome_.reset();
  return out;
}

}  // namespace gantry
