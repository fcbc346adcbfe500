// Framed messages on a worker's socket: the same bytes through FrameDecoder (fed in pieces, as a poll
// loop sees them) and through frame_recv on a real socketpair. The two readers must agree on every frame
// and on how the stream ends, and the frames must re-encode to the bytes they were read from.
//
// Input: byte 0 sets the piece size fed to the decoder; the rest is the stream.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/core/comm/frame.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// Small enough that short inputs reach the too_large refusal.
constexpr uint32_t kMaxPayload = 1024;
// A socketpair buffers far more than this, so the writer never blocks before the reader starts.
constexpr size_t kMaxStream = 64 * 1024;

struct Outcome {
  std::vector<gantry::Frame> frames;
  gantry::FrameErrc end = gantry::FrameErrc::ok;  // why the stream stopped yielding frames
};

Outcome decode_in_pieces(const uint8_t* data, size_t size, size_t piece) {
  gantry::FrameDecoder decoder(kMaxPayload);
  Outcome out;
  for (size_t at = 0; at < size && out.end == gantry::FrameErrc::ok; at += piece) {
    decoder.feed(data + at, std::min(piece, size - at));
    for (;;) {
      gantry::Result<std::optional<gantry::Frame>> f = decoder.next();
      if (!f.ok()) {
        out.end = decoder.error();
        FUZZ_CHECK(out.end != gantry::FrameErrc::ok, "the decoder failed without an error code");
        FUZZ_CHECK(!decoder.next().ok(), "a decoder error is not sticky");
        break;
      }
      if (!f->has_value()) break;
      out.frames.push_back(std::move(*f.value()));
    }
  }
  if (out.end == gantry::FrameErrc::ok) {
    out.end = decoder.mid_frame() ? gantry::FrameErrc::truncated : gantry::FrameErrc::closed;
  }
  return out;
}

Outcome receive_from_socket(const uint8_t* data, size_t size) {
  int sv[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair failed");
  size_t sent = 0;
  while (sent < size) {
    const ssize_t w = ::send(sv[0], data + sent, size - sent, MSG_NOSIGNAL);
    FUZZ_CHECK(w > 0, "cannot write the stream into the socketpair");
    sent += static_cast<size_t>(w);
  }
  ::close(sv[0]);  // the reader sees the end of the stream after the last byte
  Outcome out;
  for (;;) {
    gantry::FrameErrc errc = gantry::FrameErrc::ok;
    gantry::Result<gantry::Frame> f = gantry::frame_recv(sv[1], std::chrono::seconds(5), kMaxPayload, &errc);
    if (!f.ok()) {
      out.end = errc;
      break;
    }
    out.frames.push_back(std::move(f.value()));
  }
  ::close(sv[1]);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = data[0] % 64 + 1;
  const uint8_t* stream = data + 1;
  const size_t n = std::min(size - 1, kMaxStream);

  const Outcome pieces = decode_in_pieces(stream, n, piece);
  const Outcome socket = receive_from_socket(stream, n);
  FUZZ_CHECK(pieces.end == socket.end, "FrameDecoder and frame_recv end the stream differently");
  FUZZ_CHECK(pieces.frames.size() == socket.frames.size(),
             "FrameDecoder and frame_recv see different frames");

  std::vector<uint8_t> again;
  for (size_t i = 0; i < pieces.frames.size(); ++i) {
    const gantry::Frame& a = pieces.frames[i];
    const gantry::Frame& b = socket.frames[i];
    FUZZ_CHECK(a.type == b.type && a.payload == b.payload, "FrameDecoder and frame_recv disagree on a frame");
    FUZZ_CHECK(a.payload.size() <= kMaxPayload, "a frame over the payload limit was accepted");
    const std::vector<uint8_t> bytes = gantry::frame_encode(a.type, a.payload);
    again.insert(again.end(), bytes.begin(), bytes.end());
  }
  FUZZ_CHECK(again.size() <= n && std::equal(again.begin(), again.end(), stream),
             "the frames do not re-encode to the bytes they came from");
  return 0;
}
