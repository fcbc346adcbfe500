#include "engine/core/comm/frame.h"

#include <errno.h>
#include <poll.h>        // poll: bounded waits between partial reads/writes
#include <sys/socket.h>  // send/recv with MSG_NOSIGNAL / MSG_DONTWAIT

#include <cstring>

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

void put_le16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t get_le32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

std::string header_error(FrameErrc errc, const uint8_t* in, uint32_t max_payload) {
  char buf[160];
  switch (errc) {
    case FrameErrc::bad_magic:
      std::snprintf(buf, sizeof buf, "bad magic 0x%08x (expected 0x%08x, \"GNTF\")", get_le32(in),
                    kFrameMagic);
      break;
    case FrameErrc::bad_version:
      std::snprintf(buf, sizeof buf, "unsupported frame version %u (this reader speaks %u)", in[4],
                    kFrameVersion);
      break;
    case FrameErrc::bad_header:
      std::snprintf(buf, sizeof buf, "reserved header field is 0x%04x, must be 0", get_le16(in + 6));
      break;
    case FrameErrc::too_large:
      std::snprintf(buf, sizeof buf, "oversized frame: payload of %u bytes exceeds the limit of %u bytes",
                    get_le32(in + 8), max_payload);
      break;
    default:
      std::snprintf(buf, sizeof buf, "%s", frame_errc_name(errc));
  }
  return buf;
}

Status fail(FrameErrc* out, FrameErrc errc, const std::string& message) {
  if (out) *out = errc;
  return Status::error(message);
}

// Milliseconds left until `deadline`, rounded up so a poll never spins on a sub-millisecond remainder;
// 0 when it has passed.
int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left);
}

// Waits until `fd` is ready for `events` or the deadline passes. Returns 1 ready, 0 timeout, -1 error.
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    return rc;
  }
}

// Reads exactly n bytes. `got` counts bytes read so far (also on failure, for the message).
FrameErrc read_exact(int fd, uint8_t* dst, size_t n, Clock::time_point deadline, size_t* got, int* err) {
  *got = 0;
  while (*got < n) {
    ssize_t r = ::recv(fd, dst + *got, n - *got, MSG_DONTWAIT);
    if (r > 0) {
      *got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return FrameErrc::closed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = errno;
      return (errno == ECONNRESET) ? FrameErrc::closed : FrameErrc::io;
    }
    int rc = wait_fd(fd, POLLIN, deadline);
    if (rc == 0) return FrameErrc::timeout;
    if (rc < 0) {
      *err = errno;
      return FrameErrc::io;
    }
  }
  return FrameErrc::ok;
}

}  // namespace

const char* frame_errc_name(FrameErrc errc) {
  switch (errc) {
    case FrameErrc::ok:
      return "ok";
    case FrameErrc::timeout:
      return "timeout";
    case FrameErrc::closed:
      return "peer closed";
    case FrameErrc::truncated:
      return "truncated frame";
    case FrameErrc::bad_magic:
      return "bad magic";
    case FrameErrc::bad_version:
      return "bad version";
    case FrameErrc::bad_header:
      return "bad header";
    case FrameErrc::too_large:
      return "oversized frame";
    case FrameErrc::io:
      return "socket error";
  }
  return "unknown";
}

void frame_header_encode(uint8_t type, uint32_t length, uint8_t out[kFrameHeaderBytes]) {
  put_le32(out, kFrameMagic);
  out[4] = kFrameVersion;
  out[5] = type;
  put_le16(out + 6, 0);
  put_le32(out + 8, length);
}

FrameErrc frame_header_decode(const uint8_t in[kFrameHeaderBytes], uint32_t max_payload, FrameHeader* out) {
  if (get_le32(in) != kFrameMagic) return FrameErrc::bad_magic;
  if (in[4] != kFrameVersion) return FrameErrc::bad_version;
  if (get_le16(in + 6) != 0) return FrameErrc::bad_header;
  uint32_t length = get_le32(in + 8);
  if (length > max_payload) return FrameErrc::too_large;
  out->type = in[5];
  out->length = length;
  return FrameErrc::ok;
}

std::vector<uint8_t> frame_encode(uint8_t type, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out(kFrameHeaderBytes + payload.size());
  frame_header_encode(type, static_cast<uint32_t>(payload.size()), out.data());
  if (!payload.empty()) std::memcpy(out.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

Status frame_send(int fd, FrameType type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout,
                  FrameErrc* errc) {
  return frame_send(fd, static_cast<uint8_t>(type), payload, timeout, errc);
}

Status frame_send(int fd, uint8_t type, std::span<const uint8_t> payload, std::chrono::milliseconds timeout,
                  FrameErrc* errc) {
  if (errc) *errc = FrameErrc::ok;
  if (payload.size() > UINT32_MAX) {
    return fail(
        errc, FrameErrc::too_large,
        "frame send: payload of " + std::to_string(payload.size()) + " bytes exceeds the format's 4 GiB");
  }
  const auto deadline = Clock::now() + timeout;
  uint8_t header[kFrameHeaderBytes];
  frame_header_encode(type, static_cast<uint32_t>(payload.size()), header);
  // Header and payload go out as two pieces of one logical write; tracking a single offset across both
  // avoids copying a large payload just to prepend 12 bytes.
  const size_t total = kFrameHeaderBytes + payload.size();
  size_t sent = 0;
  while (sent < total) {
    const uint8_t* src =
        sent < kFrameHeaderBytes ? header + sent : payload.data() + (sent - kFrameHeaderBytes);
    size_t n = sent < kFrameHeaderBytes ? kFrameHeaderBytes - sent : total - sent;
    ssize_t w = ::send(fd, src, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      sent += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      int e = errno;
      FrameErrc why = (e == EPIPE || e == ECONNRESET) ? FrameErrc::closed : FrameErrc::io;
      return fail(errc, why,
                  std::string("frame send: ") +
                      (why == FrameErrc::closed ? "peer closed the stream" : "send failed") + " after " +
                      std::to_string(sent) + " of " + std::to_string(total) + " bytes (" + std::strerror(e) +
                      ")");
    }
    int rc = wait_fd(fd, POLLOUT, deadline);
    if (rc == 0) {
      return fail(errc, FrameErrc::timeout,
                  "frame send: timed out after " + std::to_string(timeout.count()) + " ms with " +
                      std::to_string(sent) + " of " + std::to_string(total) + " bytes written");
    }
    if (rc < 0)
      return fail(errc, FrameErrc::io, std::string("frame send: poll failed: ") + std::strerror(errno));
  }
  return Status();
}

Result<Frame> frame_recv(int fd, std::chrono::milliseconds timeout, uint32_t max_payload, FrameErrc* errc) {
  if (errc) *errc = FrameErrc::ok;
  const auto deadline = Clock::now() + timeout;
  uint8_t header[kFrameHeaderBytes];
  size_t got = 0;
  int err = 0;
  FrameErrc rc = read_exact(fd, header, kFrameHeaderBytes, deadline, &got, &err);
  if (rc == FrameErrc::closed && got > 0) rc = FrameErrc::truncated;
  switch (rc) {
    case FrameErrc::ok:
      break;
    case FrameErrc::closed:
      return fail(errc, rc, "frame recv: peer closed the stream");
    case FrameErrc::truncated:
      return fail(errc, rc,
                  "frame recv: truncated frame: peer closed after " + std::to_string(got) + " of " +
                      std::to_string(kFrameHeaderBytes) + " header bytes");
    case FrameErrc::timeout:
      return fail(errc, rc,
                  "frame recv: timed out after " + std::to_string(timeout.count()) + " ms (" +
                      std::to_string(got) + " of " + std::to_string(kFrameHeaderBytes) +
                      " header bytes received)");
    default:
      return fail(errc, rc, std::string("frame recv: ") + std::strerror(err));
  }
  FrameHeader h;
  if (FrameErrc bad = frame_header_decode(header, max_payload, &h); bad != FrameErrc::ok) {
    return fail(errc, bad, "frame recv: " + header_error(bad, header, max_payload));
  }
  Frame frame;
  frame.type = h.type;
  frame.payload.resize(h.length);
  rc = read_exact(fd, frame.payload.data(), h.length, deadline, &got, &err);
  switch (rc) {
    case FrameErrc::ok:
      return frame;
    case FrameErrc::closed:
      return fail(errc, FrameErrc::truncated,
                  "frame recv: truncated frame: peer closed after " + std::to_string(got) + " of " +
                      std::to_string(h.length) + " payload bytes (frame type " + std::to_string(h.type) +
                      ")");
    case FrameErrc::timeout:
      return fail(errc, rc,
                  "frame recv: timed out after " + std::to_string(timeout.count()) + " ms (" +
                      std::to_string(got) + " of " + std::to_string(h.length) + " payload bytes received)");
    default:
      return fail(errc, rc, std::string("frame recv: ") + std::strerror(err));
  }
}

void FrameDecoder::feed(const uint8_t* data, size_t n) {
  if (errc_ != FrameErrc::ok || n == 0) return;
  // Drop consumed bytes only once they dominate the buffer: copying on every frame would make a burst of
  // small frames quadratic.
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), data, data + n);
}

Result<std::optional<Frame>> FrameDecoder::next() {
  if (errc_ != FrameErrc::ok) return Status::error(error_);
  if (buf_.size() - pos_ < kFrameHeaderBytes) return std::optional<Frame>();
  const uint8_t* head = buf_.data() + pos_;
  FrameHeader h;
  if (FrameErrc bad = frame_header_decode(head, max_payload_, &h); bad != FrameErrc::ok) {
    errc_ = bad;
    error_ = "frame decode: " + header_error(bad, head, max_payload_);
    return Status::error(error_);
  }
  if (buf_.size() - pos_ - kFrameHeaderBytes < h.length) return std::optional<Frame>();
  Frame frame;
  frame.type = h.type;
  frame.payload.assign(head + kFrameHeaderBytes, head + kFrameHeaderBytes + h.length);
  pos_ += kFrameHeaderBytes + h.length;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return std::optional<Frame>(std::move(frame));
}

}  // namespace gantry
