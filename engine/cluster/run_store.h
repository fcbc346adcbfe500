// A run's rendezvous store as the coordinator holds it: in its own process (the default of the
// `coordinator` command), so that a coordinator that dies (kill -9) does not take with it the store its
// workers still use (the checkpoint protocol's shard reports, checkpoint.h), and a restarted coordinator
// re-adopts the gang with its store intact; or in the coordinator's process (CoordinatorOptions::store_exe
// empty: tests and embedders without the gantry-engine binary), which a coordinator's death ends.
//
//   Result<std::unique_ptr<RunStore>> s = RunStore::start("/usr/bin/gantry-engine", "127.0.0.1", log);
//   nodes_meet_at(host + ":" + std::to_string((*s)->port()));
//
// The store process (`gantry-engine rendezvous-store`, run_store_main) ends by itself once the gang it
// served has gone (every client connected and then left) or when no client came within its idle limit, so
// nobody needs to signal it: not the coordinator that started it, nor one that adopted the run.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "engine/core/worker/rendezvous_server.h"
#include "telemetry/status.h"

namespace gantry {

class RunStore {
 public:
  // `exe` "" = in this process; else `exe rendezvous-store` in a session of its own, its output appended
  // to `log`. Returns once the store listens (its port known), or an error naming why not.
  static Result<std::unique_ptr<RunStore>> start(const std::string& exe, const std::string& host,
                                                 const std::string& log);
  int port() const { return port_; }
  int64_t pid() const { return pid_; }  // the store process; 0 in this process

 private:
  RunStore() = default;
  std::unique_ptr<RendezvousServer> local_;
  int port_ = 0;
  int64_t pid_ = 0;
};

struct RunStoreProcessOptions {
  std::string host = "127.0.0.1";
  std::string port_file;  // "<port> <pid>\n", written whole once listening
  // Exits this long after its last client left (the gang ended), and after no_client_limit without a
  // client ever (a placement whose workers never came).
  std::chrono::milliseconds linger{2000};
  std::chrono::milliseconds no_client_limit{std::chrono::minutes(10)};
};

// The store process's body (gantry-engine rendezvous-store): serves until the rules above or *stop.
Status run_store_main(const RunStoreProcessOptions& o, const std::atomic<bool>* stop);

}  // namespace gantry
