// The node agent (`gantry-engine agent`): one per node. It registers the node's slots with the coordinator,
// then heartbeats; each beat carries the records its workers sent since the last one (one batch per node
// per beat: DESIGN.md's O(nodes) ingest) and how its gangs ended, and each reply says what to do: start
// this node's share of a placed run (a gang of workers through engine/core/worker/gang.h, meeting the
// other nodes' workers in the coordinator's rendezvous store), deliver an operator's command to rank 0,
// or stop a run. It also serves the node's Prometheus /metrics (and an open /healthz) on a port of its
// own: the latest step record of each local rank of the runs it executes, and its own counters.
//
//   Agent agent({.url = url, .token = token, .node = "node-0", .slots = 2, .dir = "/tmp/a0"});
//   Status s = agent.run(&g_stop);   // until *stop (SIGTERM): then its gangs stop with a checkpoint
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "telemetry/status.h"

namespace gantry {

struct AgentOptions {
  std::string url;  // the coordinator
  std::string
      token;  // what it registers with: the agents' join token (or the operator's); /metrics needs it too
  std::string ca_file;
  std::string node;    // this node's id, unique in the cluster
  int slots = 1;       // devices (GPUs, or CPU slots) the node offers
  bool spare = false;  // held back by placement until a job (or a move off a quarantined node) needs it
  std::string dir;     // the agent's own files (configs of the runs it starts)
  std::string exe = "/proc/self/exe";  // the worker binary
  // The coordinator unreachable for this long: said in the log. The gangs keep training either way, their
  // records wait here (bounded, the oldest rank-step records dropped and counted past the bound), and the
  // agent retries with backoff; a coordinator restarted on the same folder gets them back when the agent
  // registers again (it reports its gangs for re-adoption).
  std::chrono::milliseconds coordinator_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds stop_grace{std::chrono::seconds(30)};  // workers' time to checkpoint on stop
  // /metrics (bearer `token`, like the coordinator's routes) and /healthz. Port 0 = a free one; the URL is
  // logged at start and written to <dir>/metrics_url. Another host than loopback exposes the node's figures.
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 0;
  // Health checks (node_health.h), run every beat and reported in it: free space of `dir` below this many
  // GiB marks the node unhealthy (0 = no disk check). A file <dir>/min_free_disk_gb, re-read every check,
  // overrides it, so an operator (or a test) changes the threshold without restarting the agent; the real
  // statvfs of `dir` still decides. NVML and the kernel log's Xids are checked where present.
  double min_free_disk_gb = 1.0;
  std::string kmsg_path = "/dev/kmsg";
  std::string nvml_library = "libnvidia-ml.so.1";
  // Device telemetry (device_sampler.h: GPUs through NVML, the node from /proc), one round per interval,
  // sent in the beats; 0 = none.
  std::chrono::milliseconds device_sample_interval{std::chrono::seconds(1)};
  // Where the in-memory copies of its runs' state live (agent_memory.h); "" = a folder of its own in
  // /dev/shm (RAM), else <dir>/memory. Removed when the agent ends.
  std::string memory_dir;
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Registers and serves until *stop becomes true (then stops every gang and returns ok). A coordinator
  // that goes away does not end it. Every worker is reaped before it returns.
  Status run(const std::atomic<bool>* stop);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gantry
