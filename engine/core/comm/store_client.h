// The worker's side of rendezvous: set/get/wait against the launcher's StoreServer over the socket the
// worker inherited. Plain Status values, no Gloo or NCCL types: the Gloo adapter (gloo_store.h) and the
// NCCL communicator (publishing its unique id) both sit on top of it.
//
//   StoreClient store(fd);                        // does not take the socket: the worker runtime owns it
//   if (Status st = store.set("nccl/id", id_bytes, 30s); !st.ok()) return st;
//   Result<std::vector<uint8_t>> id = store.get("nccl/id", 30s);  // blocks until some rank set it
//
// One request at a time per socket (a mutex serialises callers). The worker runtime multiplexes the same
// socket with one-way frames to the launcher (send(): hello, step records, heartbeats, exit); a second
// mutex serialises every write, so a frame never lands inside another, and is held only while bytes are
// written: a heartbeat goes out while a request waits for its reply (a checkpoint's store wait). The store
// client stays the socket's only reader: the launcher's commands (frame.h 0x30-0x3f) that arrive while a
// request waits for its reply are kept, and take_frames() hands them out, with any that arrived since,
// without blocking.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/comm/frame.h"
#include "telemetry/status.h"

namespace gantry {

class StoreClient {
 public:
  explicit StoreClient(int fd) : fd_(fd) {}

  // Sets `key` (overwriting). Fails on timeout, a closed socket, or the server refusing the value.
  Status set(std::string_view key, std::span<const uint8_t> value, std::chrono::milliseconds timeout);
  // The value of `key`, waiting up to `timeout` for some client to set it.
  Result<std::vector<uint8_t>> get(std::string_view key, std::chrono::milliseconds timeout);
  // Returns once every key is set; the timeout error names the keys still missing.
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // wait() that is not a failure when it runs out: true once every key is set, false when the server's
  // wait of `wait` passed first. A thread polls with it in short calls so that other threads' requests on
  // the same socket (the train loop's commands) get through between them (the async checkpoint writer).
  Result<bool> wait_some(const std::vector<std::string>& keys, std::chrono::milliseconds wait);
  // Sends one frame that expects no reply (the worker runtime's frames, frame.h 0x20-0x2f), between
  // requests. A send that fails part-way leaves the stream out of step, so it breaks the connection for
  // every later call, as a failed request does. Store frame types are refused: their replies would
  // confuse request().
  Status send(FrameType type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout);

  // Moves the unsolicited frames (types 0x30-0x3f: commands from the launcher) received so far into *out,
  // in arrival order, reading what the socket holds without waiting. Fails once the connection is broken
  // (the launcher is gone), like every other call.
  Status take_frames(std::vector<Frame>* out);

  int fd() const { return fd_; }

 private:
  // Sends one request and returns its reply (store_ok / store_value / store_error), skipping late replies
  // to requests an earlier call gave up on.
  Result<Frame> request(FrameType type, uint64_t id, std::span<const uint8_t> payload,
                        std::chrono::milliseconds timeout, const char* what);

  // Marks the connection broken (the first cause stays) / the cause, or "" while it is usable.
  void set_broken(const std::string& why);
  std::string broken() const;

  int fd_;
  std::mutex read_mu_;   // one request or take_frames() at a time: the socket's only reader
  std::mutex write_mu_;  // one frame written at a time, from any thread
  mutable std::mutex broken_mu_;
  // Bytes of a reply not yet complete survive a timed-out call, so the stream never gets out of step.
  FrameDecoder decoder_;
  // After the server closed the socket or sent garbage, every later call fails with the first cause.
  std::string broken_;
  // Commands that arrived while a request waited for its reply, until take_frames().
  std::vector<Frame> unsolicited_;
  // Reads whatever the socket holds into the decoder without blocking; false (broken_ set) at its end.
  bool read_available();
};

// Request ids come from one process-wide counter so two StoreClients on the same socket (one per
// communicator) can never mistake each other's replies.
uint64_t store_next_request_id();

}  // namespace gantry
