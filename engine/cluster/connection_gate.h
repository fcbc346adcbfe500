// The HTTP server's front door: it holds every connection that is not being served, and hands one to a
// serving thread only once the connection's request header has arrived whole. A thread is then never held
// by a client that connects and says nothing, trickles its header a byte at a time, or idles between
// kept-alive requests: such connections wait here, cost one descriptor each, and are closed at their
// deadline or when too many wait. Requests go to one of two lanes, each with threads of its own, so the
// agents' heartbeats never queue behind the public API's callers (a slow query, an event stream).
//
//   ConnectionGate gate({.lane_of = [](std::string_view head) { return head.starts_with("POST /v1/agents") ?
//   1 : 0; }},
//                       [&](int fd, size_t header_bytes) { return serve_one_request(fd, header_bytes); });
//   gate.start();
//   ... for each accepted socket: gate.admit(fd) ...
//   gate.stop();  // closes what waits, lets requests in flight finish, joins
//
// Linux only (epoll, edge-triggered: a header that grows wakes the gate once per arrival, so a client
// trickling bytes cannot make it spin).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "telemetry/status.h"

namespace gantry {

struct ConnectionGateOptions {
  size_t max_waiting = 512;  // connections held without a whole header; past it the oldest goes
  std::chrono::milliseconds header_timeout{10000};     // a new connection's whole first header
  std::chrono::milliseconds keep_alive_timeout{5000};  // a kept-alive connection's next header
  size_t max_header_bytes = 16384;                     // a longer header is refused (431) and closed
  int threads[2] = {16, 4};                            // serving threads per lane: [0] public, [1] agents
  // Picks the lane from the start of the request ("POST /v1/agents/n1/heartbeat HTTP/1.1\r\n..."); 0 or 1.
  std::function<int(std::string_view head)> lane_of;
  // Per lane: serve at most one request per target (method and path, decoded, without query or trailing
  // '/') at a time; another for that target waits here, holding no thread, within its header deadline.
  // For the agents' lane: each agent sends one request at a time to its own path, so requests that
  // trickle their bodies under one target (a holder of the join token on "/v1/agents") hold one thread of
  // the lane, not all of them, and the other nodes' heartbeats go on.
  bool one_per_target[2] = {false, false};
};

struct ConnectionGateStats {
  uint64_t admitted = 0;   // connections taken (accepted, or back after a kept-alive request)
  uint64_t served = 0;     // requests handed to a lane
  uint64_t timed_out = 0;  // closed at their deadline without a whole header
  uint64_t evicted = 0;    // closed because too many waited
  uint64_t too_large = 0;  // closed for a header past max_header_bytes
  uint64_t waiting = 0;    // held now
};

class ConnectionGate {
 public:
  // Serves one request on `fd` whose header (the first `header_bytes` bytes waiting on the socket) is
  // whole. Returns true to keep the connection alive (it comes back to the gate for its next request),
  // false when the connection must close (the gate closes it).
  using Serve = std::function<bool(int fd, size_t header_bytes)>;

  ConnectionGate(ConnectionGateOptions options, Serve serve);
  ~ConnectionGate();  // stop()
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  Status start();
  // Takes ownership of a connected socket. Never blocks.
  void admit(int fd);
  // Closes every waiting connection, lets each lane finish the request it serves, joins. Idempotent.
  void stop();
  ConnectionGateStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gantry
