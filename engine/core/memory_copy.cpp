#include "engine/core/memory_copy.h"

#include <chrono>

namespace gantry {

std::string memory_copy_rank_dir(const std::string& memory_dir, int rank) {
  return memory_dir + "/rank-" + std::to_string(rank);
}

MemoryCopies::MemoryCopies(int every, std::string memory_dir, Backend& backend, const CheckpointGang* gang)
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
}

Result<double> MemoryCopies::write(const CheckpointMeta& meta) {
  const auto t0 = std::chrono::steady_clock::now();
  // keep 2: the newest, and the one before it, which is the newest complete set while a write is cut off
  // between ranks (some committed the new step, some not) by the failure that needs the copies.
  Result<CheckpointWritten> w =
      checkpoint_write(dir_, backend_, meta, /*keep=*/2, gang_on_ ? &gang_ : nullptr);
  if (!w.ok()) return w.status();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gantry
