// Framed messages over a stream socket: how a worker talks to its launcher/agent over the socket it
// inherits (DESIGN.md: workers have no network library of their own). Each frame is a 12-byte header
// then the payload; every field little-endian:
//
//   offset  bytes  field
//   0       4      magic   0x46544E47 ("GNTF" on the wire)
//   4       1      version 1
//   5       1      type    a FrameType (the registry below keeps the project's types from colliding)
//   6       2      reserved, must be 0 (so a later version can use it and old readers notice)
//   8       4      length  payload bytes, at most the reader's limit (kFrameMaxPayload by default)
//
// A reader refuses a bad magic, an unknown version, a non-zero reserved field or an oversized length
// before reading any payload: after such an error the stream is out of step and must be closed.
//
//   Status st = frame_send(fd, FrameType::store_set, payload, std::chrono::seconds(5));
//   Result<Frame> f = frame_recv(fd, std::chrono::seconds(5));
//   if (!f.ok()) return f.status();            // "frame recv: timed out after 5000 ms ..."
//
// Poll loops (the store server, later the agent) use FrameDecoder instead: feed it whatever recv()
// returned, take complete frames out.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

inline constexpr uint32_t kFrameMagic = 0x46544E47;  // bytes 'G' 'N' 'T' 'F'
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 12;
// Default payload limit: far above any rendezvous value (a Gloo address table is ~140 bytes per rank)
// and step-record batch, low enough that a corrupt length cannot make a reader allocate gigabytes.
inline constexpr uint32_t kFrameMaxPayload = 16u << 20;

// Every frame type the project sends, in one place so two subsystems never pick the same number.
// 0x10-0x1f: the rendezvous store (store_server.h describes the payloads). 0x20-0x3f: the worker
// runtime (engine/core/worker/worker_frames.h describes the payloads; docs/COMM.md has the tables):
// 0x20-0x2f worker -> launcher, 0x30-0x3f launcher -> worker (commands). 0x40- for later use.
enum class FrameType : uint8_t {
  store_set = 0x10,
  store_get = 0x11,
  store_wait = 0x12,
  store_ok = 0x18,
  store_value = 0x19,
  store_error = 0x1a,
  worker_hello = 0x20,    // a worker joined: rank, world, local rank, pid, device, host
  worker_records = 0x21,  // a telemetry RecordBatch (record_codec.h): this rank's step, rank 0's global step
  worker_exit = 0x22,     // the worker's final status and message, sent just before it exits
  worker_run = 0x23,      // rank 0, once before the first step: what the run is (for the history)
  worker_heartbeat = 0x24,  // step, phase and collective sequence number, from a thread that never blocks
  worker_command = 0x30,    // launcher -> worker: an operator action (checkpoint, pause, resume, stop)
  worker_inject = 0x31,     // launcher -> worker: a drill's fault for this rank (slow forward, NaN grads)
};

// Why a frame operation failed; the Status message says the same in words.
enum class FrameErrc {
  ok,
  timeout,      // the deadline passed first
  closed,       // the peer closed the stream at a frame boundary (orderly end)
  truncated,    // the peer closed the stream in the middle of a frame
  bad_magic,    // not our protocol, or the stream is out of step
  bad_version,  // a version this reader does not speak
  bad_header,   // a reserved field is not zero
  too_large,    // the length exceeds the reader's (or the format's) limit
  io,           // any other socket error (the errno text is in the message)
};
const char* frame_errc_name(FrameErrc errc);

struct Frame {
  uint8_t type = 0;
  std::vector<uint8_t> payload;
};

struct FrameHeader {
  uint8_t type = 0;
  uint32_t length = 0;
};

// The 12 header bytes for a payload of `length` bytes.
void frame_header_encode(uint8_t type, uint32_t length, uint8_t out[kFrameHeaderBytes]);
// Checks and decodes 12 header bytes; the length is checked against `max_payload`.
FrameErrc frame_header_decode(const uint8_t in[kFrameHeaderBytes], uint32_t max_payload, FrameHeader* out);
// Header and payload in one buffer (what a poll loop queues for sending). The payload must fit the
// format's 32-bit length; callers keep it under their peer's limit.
std::vector<uint8_t> frame_encode(uint8_t type, std::span<const uint8_t> payload);

// Blocking send and receive on a stream socket, bounded by `timeout` for the whole frame (poll(2)
// between partial writes/reads, so a slow peer cannot hold the caller past it). The socket may be
// blocking or not. Writes use MSG_NOSIGNAL: a closed peer is an error value, never SIGPIPE. `errc`, when
// given, receives the reason for callers that act on it (the store client treats `closed` as fatal).
Status frame_send(int fd, FrameType type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout,
                  FrameErrc* errc = nullptr);
Status frame_send(int fd, uint8_t type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout,
                  FrameErrc* errc = nullptr);
Result<Frame> frame_recv(int fd, std::chrono::milliseconds timeout, uint32_t max_payload = kFrameMaxPayload,
                         FrameErrc* errc = nullptr);

// Incremental decoding for poll loops: no blocking, no per-peer deadline, one buffer per connection.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_payload = kFrameMaxPayload) : max_payload_(max_payload) {}

  // Appends bytes just read from the socket.
  void feed(const uint8_t* data, size_t n);
  // The next complete frame, std::nullopt when more bytes are needed, or an error (sticky: the stream is
  // out of step after it, so every later call returns the same error).
  Result<std::optional<Frame>> next();
  // True when bytes of an incomplete frame are buffered: an end of stream now means a truncated frame.
  bool mid_frame() const { return buf_.size() > pos_; }
  FrameErrc error() const { return errc_; }

 private:
  uint32_t max_payload_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;  // start of the first undecoded byte; compacted lazily so feed() stays amortised O(n)
  FrameErrc errc_ = FrameErrc::ok;
  std::string error_;
};

}  // namespace gantry
