// The rendezvous store over TCP: a StoreServer (engine/core/comm/store_server.h) on a listening socket,
// driven by a thread of its own. Two users: rank 0 of an externally launched gang (torchrun, srun) serves
// it for its peers, and the coordinator serves one per run, so that workers started by different node
// agents meet in one store (docs/CLUSTER.md says why the coordinator holds it). Frames that are not store
// requests (the worker runtime's records) are dropped: over TCP nobody wants them.
//
//   Result<std::unique_ptr<RendezvousServer>> s = RendezvousServer::start({"127.0.0.1", 0});
//   if (!s.ok()) return s.status();
//   workers_connect_to((*s)->port());                   // the port the kernel chose
//   Result<int> fd = rendezvous_connect({"127.0.0.1", port}, deadline);   // a worker's side
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "engine/core/comm/store_server.h"
#include "engine/core/worker/worker_env.h"  // HostPort
#include "telemetry/status.h"

namespace gantry {

class RendezvousServer {
 public:
  // Binds `at` (port 0: a free port, see port()) and starts serving. The error names the address and
  // the likely cause.
  static Result<std::unique_ptr<RendezvousServer>> start(const HostPort& at);
  ~RendezvousServer();  // stops the thread, closes every socket
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }
  size_t clients() const { return clients_.load(); }
  // Returns once every peer has disconnected, or after `limit`.
  void wait_until_idle(std::chrono::milliseconds limit);

 private:
  RendezvousServer(int listen_fd, int port);
  void loop();

  int listen_fd_;
  int port_;
  StoreServer server_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> clients_{0};
  std::thread thread_;
};

// A blocking TCP connection to a rendezvous store, retrying until `deadline` while nobody listens yet (rank
// 0 may start its server after the others start connecting). TCP_NODELAY is set: requests are small.
Result<int> rendezvous_connect(const HostPort& at, std::chrono::steady_clock::time_point deadline);

}  // namespace gantry
