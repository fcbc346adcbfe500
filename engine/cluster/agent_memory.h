// The node agent's in-memory copies (train.memory_copy_every; engine/core/memory_copy.h). The agent owns a
// folder in the node's RAM (a tmpfs: /dev/shm/gantry-agent-<node>-<pid> by default) that outlives its
// workers: each worker of run R writes its copies under <root>/run-R/rank-<r>/step_<S> (GANTRY_MEMORY_DIR =
// <root>/run-R), and the agent
//   - reports every committed copy it holds in its heartbeat (run, rank, step, world),
//   - serves them to the other agents at GET /v1/memory/{run}/{rank}/{step}/{file} (the node's token),
//   - takes the copies the coordinator tells it to from the node before it in the run's ring (the same
//     layout under its own root: at most the two newest steps per rank, so a copy cut off by a failure
//     still leaves the step before it whole),
//   - at a recovery from memory, assembles the set the coordinator chose into <root>/restore/run-R/step_<S>
//     from the agents holding it, for its new workers to load like any checkpoint,
//   - drops a run's copies once the coordinator says the run is over.
// Files are the checkpoint format's, bit for bit, so a restore from memory is a restore from a checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/cluster/http_server.h"
#include "telemetry/status.h"

namespace gantry {

class AgentMemory {
 public:
  // root "": /dev/shm/gantry-agent-<node>-<pid> where /dev/shm is a folder, else <agent dir>/memory.
  // Folders of agents no longer running left in /dev/shm (a killed agent's) are removed.
  AgentMemory(std::string root, const std::string& node, const std::string& agent_dir, std::string token);
  ~AgentMemory();  // removes the root: the copies live as long as the agent
  AgentMemory(const AgentMemory&) = delete;
  AgentMemory& operator=(const AgentMemory&) = delete;

  const std::string& root() const { return root_; }
  std::string run_dir(int64_t run) const;  // a worker's GANTRY_MEMORY_DIR
  // Every committed copy held: [{run, rank, step, world}], for the heartbeat.
  nlohmann::json held();
  // GET /v1/memory/{run}/{rank}/{step}/{file}
  HttpResponse serve(const HttpRequest& req) const;
  // Takes {run, rank, step, url} from the agent at url (its base, "http://host:port").
  Status pull(const nlohmann::json& order);
  void drop(int64_t run);
  // The coordinator's memory_restore {step, shards: [{rank, url}]} assembled into a checkpoint folder; its
  // path, or the error that sends the workers to the disk checkpoint instead.
  Result<std::string> assemble(int64_t run, const nlohmann::json& restore);

 private:
  std::string root_;
  std::string token_;
  std::mutex mu_;                      // worlds_
  std::map<std::string, int> worlds_;  // manifest path -> its world, read once
};

}  // namespace gantry
