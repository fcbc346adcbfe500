// Asynchronous checkpoints (train.checkpoint_async): at a step boundary the train loop copies this rank's
// part of the state into host memory (the backend's snapshot: a memcpy on CPU, a copy-stream DMA into
// pinned memory on CUDA) and trains on, while a writer thread writes the shard file and takes part in the
// gang's commit (checkpoint.h's protocol, unchanged: every rank reports through the store, rank 0 writes
// the manifest and renames once every rank succeeded). At most one write is in flight: a new request
// first waits for it, and says how long it waited.
//
//   AsyncCheckpointer ckpt(root, *backend, keep, gang, hook);
//   Result<double> stall = ckpt.start(meta, /*waited_s=*/0, /*from_action=*/false);   // then train on
//   ...at each step boundary:
//   if (std::optional<Result<CheckpointDone>> d = ckpt.finished(/*wait=*/false)) report(*d);
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "telemetry/status.h"

namespace gantry {

// One committed checkpoint and what it cost. stall_s is the time the train loop was held for it (the wait
// for the write before it, then the copy into host memory; for a synchronous write, all of it); write_s
// the writer's time from the hand-over to the commit (the end of the copy on CUDA, the files, the gang's
// agreement and the rename).
struct CheckpointDone {
  CheckpointWritten written;
  int64_t step = 0;
  bool async = false;
  double stall_s = 0;
  double write_s = 0;
  double waited_s = 0;       // of stall_s, the wait for the checkpoint still in flight; 0 = none was
  bool from_action = false;  // the operator's checkpoint action asked for it
  // Async: the copy into host memory by itself (Backend::snapshot_copy_seconds); unknown for a sync write.
  std::optional<double> copy_s;
};

class AsyncCheckpointer {
 public:
  // The backend and the gang must outlive this. gang == nullptr: one process. slot: the backend's host
  // snapshot this writer uses (the in-memory copies have their own, memory_copy.h).
  AsyncCheckpointer(std::string root, Backend& backend, int keep, CheckpointGang* gang, CheckpointHook hook,
                    SnapshotSlot slot = SnapshotSlot::kCheckpoint);
  // A write still in flight is cancelled (its gang waits give up; the step stays uncommitted) and joined.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Copies the state into host memory and hands it to a new writer thread; returns the seconds this took
  // (the train loop's stall, to which the caller adds waited_s). Only with nothing in flight: take the
  // previous outcome with finished(true) first.
  Result<double> start(const CheckpointMeta& meta, double waited_s, bool from_action);
  // Takes the snapshot's host memory now (pinned on CUDA: about 12 bytes a parameter, and a pinned
  // allocation of gigabytes takes ~0.1 s a GB), so that the first checkpoint's stall is the copy alone.
  void reserve();
  bool in_flight() const { return thread_.joinable(); }
  // The outcome of the write in flight once it has finished (waiting for it when `wait`); nullopt while
  // it runs, or when nothing is in flight.
  std::optional<Result<CheckpointDone>> finished(bool wait);

 private:
  void write(CheckpointMeta meta, CheckpointSnapshot snapshot);

  std::string root_;
  Backend& backend_;
  int keep_;
  CheckpointGang* gang_;
  CheckpointHook hook_;
  SnapshotSlot slot_;
  std::atomic<bool> cancel_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::optional<Result<CheckpointDone>> outcome_;
  CheckpointDone pending_;  // what the train loop knew at start()
};

}  // namespace gantry
