// In-memory copies of the training state (train.memory_copy_every, issue 16's fast restore). Every N steps
// each rank writes its shard, in the checkpoint format (checkpoint.h), into a folder of its node agent's
// memory (GANTRY_MEMORY_DIR: <agent memory>/run-<id>/rank-<r>, a tmpfs by default, so the copy outlives the
// worker), through the gang's commit protocol in its node-local mode: each rank's folder then holds one
// committed step with its own shard and the manifest that lists every rank's. The two newest are kept (a
// write cut off between ranks leaves the one before whole).
// The agent reports what it holds, copies it to the next node of the run's ring, and a recovery assembles a
// complete set from the agents (engine/cluster/agent_memory.h).
//
//   MemoryCopies copies(config.train.memory_copy_every, memory_dir, *backend, gang);
//   if (copies.due(step)) copies.write(meta);   // at a step boundary, after the update
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "telemetry/status.h"

namespace gantry {

// The folder a rank's copies go to under the memory folder the agent gives: "<memory_dir>/rank-<rank>".
std::string memory_copy_rank_dir(const std::string& memory_dir, int rank);

class MemoryCopies {
 public:
  // every 0 or memory_dir "": off. gang == nullptr: one process. The backend and gang must outlive this.
  MemoryCopies(int every, std::string memory_dir, Backend& backend, const CheckpointGang* gang);

  bool on() const { return every_ > 0 && !dir_.empty(); }
  bool due(int64_t step) const { return on() && step > 0 && step % every_ == 0; }
  // Writes this rank's copy of meta.step (dropping all but the one before) and returns the seconds it took:
  // the train loop's stall. Every rank of the gang must call it at the same step.
  Result<double> write(const CheckpointMeta& meta);

 private:
  int every_;
  std::string dir_;  // this rank's folder
  Backend& backend_;
  CheckpointGang gang_;  // the run's gang, node-local, in a key space of its own
  bool gang_on_;
};

}  // namespace gantry
