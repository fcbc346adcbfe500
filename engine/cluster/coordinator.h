// The coordinator: the cluster's one control process (`gantry-engine coordinator`). It serves the HTTP API
// (docs/CLUSTER.md lists the routes), keeps the run database (storage/HistoryDb in <dir>/cluster.sqlite),
// registers node agents and watches their heartbeats, places submitted jobs all-or-nothing
// (placement.h), serves each run's rendezvous store on a TCP port of its own, and turns operator
// actions into commands that the agents hand to rank 0.
//
// Agents talk to it over the same API with the same token: they register, then heartbeat (every 200 ms by
// default) with their node's records since the last beat (one batch per node per beat) and how their
// gangs ended; the reply carries what the node must do (start its share of a run, deliver a command to
// rank 0, stop a run). Nothing is pushed to an agent, so an agent behind NAT or a slow link needs no
// listening socket.
//
//   Coordinator c({.dir = "/tmp/cluster", .token = token});
//   if (Status s = c.start(); !s.ok()) return fail(s.message());
//   std::printf("%s\n", c.url().c_str());
//   ... until SIGTERM ...
//   c.stop();
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "telemetry/status.h"

namespace gantry {

// A node is lost after this many beat intervals without a beat, once intervals are long
// (CoordinatorOptions::heartbeat).
inline constexpr int kMissedBeatsLost = 5;
// ... and after this many once a peer gang of one of its runs has failed: a node killed with its workers
// breaks its peers' collectives at once, and their agents report that within a beat, so a node that is
// also silent is the likely cause and need not be waited for the whole node_timeout. A live node keeps
// beating (and reports its own gang's end), so it is not lost by this.
inline constexpr int kMissedBeatsSuspect = 3;

struct CoordinatorOptions {
  std::string dir;                 // state: cluster.sqlite, runs/<id>/ (config, checkpoints, data)
  std::string host = "127.0.0.1";  // the API's address
  int port = 0;                    // 0 = a free port (url() says which)
  std::string token;               // the operator's bearer token (token.h): every route
  // The agents' join token: good for registering a node (POST /v1/agents) and nothing else; "" = only the
  // operator's token registers. Each registration is answered with a credential of that node's own, good for
  // that node's heartbeats only, so an agent's host need hold neither the operator's token nor another
  // node's credential.
  std::string agent_token;
  // Where each run's rendezvous store listens; the workers of every node must reach it.
  std::string rendezvous_host = "127.0.0.1";
  // Agents beat every `heartbeat`, or less often once the nodes are many: the interval each is told (in
  // every reply) keeps the cluster's beats under max_beats_per_s, so a beat carries more steps instead of
  // the coordinator answering more requests (12,500 nodes at 2,500 beats/s: a beat every 5 s, 5 steps of
  // a run at one step a second). A node is lost after node_timeout without a beat, or after
  // kMissedBeatsLost intervals when the interval has grown that long. Both are in GET /v1/cluster.
  std::chrono::milliseconds heartbeat{200};
  double max_beats_per_s = 2500;
  std::chrono::milliseconds node_timeout{5000};
  size_t max_body_bytes = 1u << 20;  // agents split their record batches to fit
  // POST /v1/runs/{id}/inject (a worker killed or hung on purpose, for drills, tests and benchmarks) is
  // refused (403) unless this is set: an operator's token alone must not be able to break a production run.
  bool allow_fault_injection = false;
  std::string tls_cert_file, tls_key_file;  // HTTPS (optional)
  // Each run's rendezvous store runs as `<store_exe> rendezvous-store` (run_store.h), a process that
  // outlives a coordinator killed mid-run; "" = in this process (it dies with the coordinator).
  std::string store_exe;
  // A coordinator started on a folder whose runs were live: how long their agents have to come back and
  // report the gangs still training (re-adoption) before such a run is interrupted.
  std::chrono::milliseconds adopt_grace{10000};
  // Alert rules (TOML, one [alert.NAME] table a rule: alert_rules.h), added to those the API left in
  // <dir>/alerts.json and replacing any of the same name; "" = none. A bad file stops start() naming it.
  std::string alerts_file;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();  // stop()
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Opens the database, starts the API and the health watch. The error names what failed.
  Status start();
  // Stops serving: the live runs are interrupted (their agents are told nothing; `down` stops the agents).
  // A coordinator that dies instead (kill -9) leaves its runs training: their agents keep their records
  // until a coordinator on the same folder re-adopts the gangs.
  void stop();
  std::string url() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gantry
