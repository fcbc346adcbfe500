#include "engine/core/memory_copy.h"

#include <chrono>

namespace gantry {

std::string memory_copy_rank_dir(const std::string& memory_dir, int rank) {
  return memory_dir + "/rank-" + std::to_string(rank);
}

MemoryCopies::MemoryCopies(int every, std::string memory_dir, Backend& backend, const CheckpointGang* gang,
                           bool async)
    : every_(every), backend_(backend), gang_on_(gang != nullptr) {
  if (gang != nullptr) {
    gang_ = *gang;
    gang_.writes = 0;
    gang_.node_local = true;
    gang_.key_space = "memory";
    gang_.poll_store = false;
    gang_.cancel = nullptr;
  }
  if (!memory_dir.empty()) dir_ = memory_copy_rank_dir(memory_dir, gang != nullptr ? gang->layout.rank : 0);
  // keep 2: the newest, and the one before it, which is the newest complete set while a write is cut off
  // between ranks (some committed the new step, some not) by the failure that needs the copies.
  if (async && on())
    async_ = std::make_unique<AsyncCheckpointer>(dir_, backend_, /*keep=*/2, gang_on_ ? &gang_ : nullptr,
                                                 CheckpointHook{}, SnapshotSlot::kMemoryCopy);
  // The pinned memory now (~0.1 s a GB on CUDA), not inside the first copy's stall.
  if (async_ != nullptr) async_->reserve();
}

Status MemoryCopies::collect(bool wait) {
  if (async_ == nullptr) return {};
  std::optional<Result<CheckpointDone>> done = async_->finished(wait);
  if (!done.has_value()) return {};
  if (!done->ok()) return done->status();
  ++written_;
  return {};
}

Result<double> MemoryCopies::write(const CheckpointMeta& meta) {
  if (async_ != nullptr) return async_->start(meta, /*waited_s=*/0, /*from_action=*/false);
  const auto t0 = std::chrono::steady_clock::now();
  Result<CheckpointWritten> w =
      checkpoint_write(dir_, backend_, meta, /*keep=*/2, gang_on_ ? &gang_ : nullptr);
  if (!w.ok()) return w.status();
  ++written_;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gantry
