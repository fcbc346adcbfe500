// In-memory copies of the training state (train.memory_copy_every, issue 16's fast restore). Every N steps
// each rank writes its shard, in the checkpoint format (checkpoint.h), into a folder of its node agent's
// memory (GANTRY_MEMORY_DIR: <agent memory>/run-<id>/rank-<r>, a tmpfs by default, so the copy outlives the
// worker), through the gang's commit protocol in its node-local mode: each rank's folder then holds one
// committed step with its own shard and the manifest that lists every rank's. The two newest are kept (a
// write cut off between ranks leaves the one before whole).
// The agent reports what it holds, copies it to the next node of the run's ring, and a recovery assembles a
// complete set from the agents (engine/cluster/agent_memory.h).
//
// With train.memory_copy_async the copy is taken like an asynchronous checkpoint (checkpoint_async.h, in
// the backend's own snapshot slot for these copies): the loop stalls only to start the copy into host
// memory, and a writer thread writes the folder. A copy due while the one before is still being written
// is skipped (every rank decides alike, from the gang's step-boundary agreement): the newest copy is
// then a few steps older, where waiting would stall every step behind a write slower than a step.
//
//   MemoryCopies copies(config.train.memory_copy_every, memory_dir, *backend, gang, async);
//   at each step boundary:  copies.collect(/*wait=*/false);
//   if (copies.due(step)) { if (gang_busy) copies.skip(); else copies.write(meta); }   // after the update
//   at the end:             copies.collect(/*wait=*/true);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/checkpoint_async.h"
#include "telemetry/status.h"

namespace gantry {

// The folder a rank's copies go to under the memory folder the agent gives: "<memory_dir>/rank-<rank>".
std::string memory_copy_rank_dir(const std::string& memory_dir, int rank);

class MemoryCopies {
 public:
  // every 0 or memory_dir "": off. gang == nullptr: one process. The backend and gang must outlive this.
  MemoryCopies(int every, std::string memory_dir, Backend& backend, const CheckpointGang* gang, bool async);
  MemoryCopies(const MemoryCopies&) = delete;
  MemoryCopies& operator=(const MemoryCopies&) = delete;

  bool on() const { return every_ > 0 && !dir_.empty(); }
  bool due(int64_t step) const { return on() && step > 0 && step % every_ == 0; }
  // Writes this rank's copy of meta.step (dropping all but the one before), or with async starts it, and
  // returns the seconds the train loop stalled for it. Every rank of the gang must call it at the same step,
  // with nothing in flight (collect first).
  Result<double> write(const CheckpointMeta& meta);
  // A due copy passed over because one was still being written somewhere in the gang.
  void skip() { ++skipped_; }
  // Async: a write started and not yet collected.
  bool in_flight() const { return async_ != nullptr && async_->in_flight(); }
  // Async: takes the outcome of a write that has finished (waiting for it when `wait`); its failure is
  // returned. Nothing in flight (or sync): ok.
  Status collect(bool wait);
  int64_t written() const { return written_; }
  int64_t skipped() const { return skipped_; }

 private:
  int every_;
  std::string dir_;  // this rank's folder
  Backend& backend_;
  CheckpointGang gang_;  // the run's gang, node-local, in a key space of its own
  bool gang_on_;
  std::unique_ptr<AsyncCheckpointer> async_;  // null: synchronous copies
  int64_t written_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace gantry
