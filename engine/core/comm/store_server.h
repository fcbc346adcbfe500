// The launcher's side of rendezvous: a key-value store served to many workers, each over its own
// socket (the one the worker inherited). Workers publish and fetch what their communicators need to
// meet: Gloo's pair addresses, NCCL's unique id. Keys are strings, values bytes; the wire format is in
// store_protocol.h.
//
// One thread drives it: poll_once() waits for socket activity (or the nearest wait deadline) and serves
// every complete request, so one slow or silent worker never holds up the others. The launcher's other
// traffic on the same sockets (step records, heartbeats; later issues) arrives through on_frame.
//
//   StoreServer server;
//   for (int r = 0; r < n; ++r) server.add_client(parent_end[r], "rank " + std::to_string(r));
//   while (server.client_count() > 0 && !deadline_passed) {
//     if (Status st = server.poll_once(std::chrono::milliseconds(50)); !st.ok()) return st;
//     for (const StoreClientGone& g : server.take_gone()) log(g.name + ": " + g.reason);
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/comm/frame.h"
#include "telemetry/status.h"

namespace gantry {

struct StoreServerOptions {
  uint32_t max_payload = kFrameMaxPayload;  // largest request frame accepted
  size_t max_key_bytes = 4096;
  size_t max_store_bytes = size_t{256} << 20;  // keys + values, all clients together
  size_t max_pending_per_client = 1024;        // blocked get/wait requests per client
  size_t max_queued_bytes = size_t{64} << 20;  // unsent replies to one client before it is dropped
  // Frames whose type is not a store request: the launcher's other traffic. Without a handler such a
  // frame is a protocol error and drops the client.
  std::function<void(int client, const Frame& frame)> on_frame;
};

// A client the server no longer serves, and why: "peer closed" (clean), or the protocol error that
// made the server drop it ("truncated frame ...", "bad magic ..."). `peer_closed`: the other end closed or
// reset the connection (cleanly or in the middle of a frame), as a process does when it dies; a launcher
// then waits for the process's exit status before blaming the protocol.
struct StoreClientGone {
  int client = -1;
  std::string name;
  std::string reason;
  bool clean = false;
  bool peer_closed = false;
};

class StoreServer {
 public:
  explicit StoreServer(StoreServerOptions options = {});
  ~StoreServer();  // closes every client socket it still holds
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Serves a connected stream socket from now on and owns it (closes it when the client goes). `name`
  // labels the client in diagnostics ("rank 3"). Returns the client's id.
  int add_client(int fd, std::string name);
  // Stops serving a client (the launcher killed its worker): closes the socket, drops its waits.
  void remove_client(int client, const std::string& reason);

  // Waits at most `timeout` for activity, then serves all complete requests and expires overdue waits.
  // An error only when poll(2) itself fails; clients' errors are reported through take_gone().
  Status poll_once(std::chrono::milliseconds timeout);
  // Makes a poll_once blocked in another thread return early. Safe from any thread or signal handler.
  void wake();

  // Queues a frame for a client (replies to the launcher's other traffic). Error for an unknown client.
  Status send(int client, uint8_t type, std::span<const uint8_t> payload);

  // The launcher's own view of the store: set() wakes waiters as a client's set would.
  void set(const std::string& key, std::vector<uint8_t> value);
  std::optional<std::vector<uint8_t>> get(const std::string& key) const;

  size_t client_count() const { return clients_.size(); }
  // Blocked get/wait requests now, all clients together.
  size_t waiter_count() const { return waiters_.size(); }
  std::vector<StoreClientGone> take_gone();

 private:
  using Clock = std::chrono::steady_clock;
  struct Client {
    int fd = -1;
    std::string name;
    FrameDecoder decoder;
    std::vector<uint8_t> out;  // encoded frames not yet written
    size_t out_pos = 0;
    size_t pending = 0;  // waiters it owns
  };
  struct Waiter {
    int client = -1;
    uint64_t request = 0;
    bool is_get = false;
    std::vector<std::string> keys;
    size_t missing = 0;
    Clock::time_point start;
    Clock::time_point deadline;
  };

  void read_client(int id);
  void handle_frame(int id, const Frame& frame);
  void handle_set(int id, uint64_t request, const std::string& key, std::vector<uint8_t> value);
  void store_put(const std::string& key, std::vector<uint8_t> value);
  void reply_ok(int id, uint64_t request);
  void reply_value(int id, uint64_t request, const std::vector<uint8_t>& value);
  void reply_error(int id, uint64_t request, uint32_t code, const std::string& message);
  void queue(int id, uint8_t type, std::span<const uint8_t> payload);
  void flush(int id);
  void drop(int id, std::string reason, bool clean, bool peer_closed = false);
  void finish_waiter(uint64_t waiter);
  void expire_waiters(Clock::time_point now);

  StoreServerOptions options_;
  int wake_fds_[2] = {-1, -1};  // self-pipe: wake() writes, poll_once reads
  int next_client_ = 0;
  std::map<int, Client> clients_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  size_t data_bytes_ = 0;
  uint64_t next_waiter_ = 0;
  std::map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiting_on_;  // key -> waiters missing it
  std::vector<StoreClientGone> gone_;
};

}  // namespace gantry
