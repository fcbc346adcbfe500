#include "engine/core/comm/store_client.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/core/comm/store_protocol.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

// The server answers a blocked get/wait itself when its wait_ms passes, naming the missing keys; the
// client waits a little longer so that answer, not a bare local timeout, is what the caller sees.
constexpr std::chrono::milliseconds kReplyGrace{500};

// frame.h: 0x30-0x3f travel launcher -> worker unasked.
constexpr uint8_t kFirstCommandType = 0x30;
constexpr uint8_t kLastCommandType = 0x3f;

uint32_t wait_ms_of(std::chrono::milliseconds timeout) {
  return static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 1, UINT32_MAX));
}

}  // namespace

uint64_t store_next_request_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void StoreClient::set_broken(const std::string& why) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_.empty()) broken_ = why;
}

std::string StoreClient::broken() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

Result<Frame> StoreClient::request(FrameType type, uint64_t id, std::span<const uint8_t> payload,
                                   std::chrono::milliseconds timeout, const char* what) {
  std::lock_guard<std::mutex> lock(read_mu_);
  auto fail = [&](const std::string& why) {
    return Status::error(std::string("store ") + what + ": " + why);
  };
  if (std::string b = broken(); !b.empty()) return fail("store connection unusable: " + b);

  const auto deadline = Clock::now() + timeout + kReplyGrace;
  {
    std::lock_guard<std::mutex> write(write_mu_);
    FrameErrc errc;
    Status sent = frame_send(fd_, type, payload, timeout + kReplyGrace, &errc);
    if (!sent.ok()) {
      // A partly written request leaves the server's decoder mid-frame: nothing later can be trusted.
      set_broken(sent.message());
      return fail(sent.message());
    }
  }
  for (;;) {
    Result<std::optional<Frame>> next = decoder_.next();
    if (!next.ok()) {
      set_broken(next.error());
      return fail(next.error());
    }
    if (next.value()) {
      Frame f = std::move(*next.value());
      if (f.type >= kFirstCommandType && f.type <= kLastCommandType) {
        unsolicited_.push_back(std::move(f));  // a command, not our reply: kept for take_frames()
        continue;
      }
      StoreReader in(f.payload.data(), f.payload.size());
      uint64_t reply_id = in.u64();
      if (!in.ok() || (f.type != static_cast<uint8_t>(FrameType::store_ok) &&
                       f.type != static_cast<uint8_t>(FrameType::store_value) &&
                       f.type != static_cast<uint8_t>(FrameType::store_error))) {
        const std::string why =
            "unexpected frame type " + std::to_string(f.type) + " on the store connection";
        set_broken(why);
        return fail(why);
      }
      if (reply_id == id) return f;
      continue;  // a late reply to a request we already gave up on
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      return fail("timed out after " + std::to_string(timeout.count()) + " ms (no reply from the server)");
    pollfd p = {fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1'000'000'000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return fail(std::string("poll failed: ") + std::strerror(errno));
    if (rc == 0) continue;
    uint8_t buf[4096];
    ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      decoder_.feed(buf, static_cast<size_t>(r));
    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      const std::string why = r == 0 ? "peer closed (the launcher's end of the socket is gone)"
                                     : std::string("peer closed (") + std::strerror(errno) + ")";
      set_broken(why);
      return fail(why);
    }
  }
}

namespace {

Status error_of(const Frame& f, const char* what) {
  StoreReader in(f.payload.data(), f.payload.size());
  in.u64();
  uint32_t code = in.u32();
  std::vector<uint8_t> msg = in.rest();
  std::string text(msg.begin(), msg.end());
  const char* kind = code == static_cast<uint32_t>(StoreErrorCode::timeout)     ? "timeout: "
                     : code == static_cast<uint32_t>(StoreErrorCode::not_found) ? "not found: "
                     : code == static_cast<uint32_t>(StoreErrorCode::too_large) ? "refused: "
                                                                                : "bad request: ";
  return Status::error(std::string("store ") + what + ": " + kind + text);
}

}  // namespace

Status StoreClient::set(std::string_view key, std::span<const uint8_t> value,
                        std::chrono::milliseconds timeout) {
  uint64_t id = store_next_request_id();
  StoreWriter w;
  w.u64(id);
  w.str(key);
  w.bytes(value.data(), value.size());
  Result<Frame> r = request(FrameType::store_set, id, w.out(), timeout, "set");
  if (!r.ok()) return r.status();
  if (r->type == static_cast<uint8_t>(FrameType::store_ok)) return Status();
  return error_of(r.value(), "set");
}

Result<std::vector<uint8_t>> StoreClient::get(std::string_view key, std::chrono::milliseconds timeout) {
  uint64_t id = store_next_request_id();
  StoreWriter w;
  w.u64(id);
  w.u32(wait_ms_of(timeout));
  w.str(key);
  Result<Frame> r = request(FrameType::store_get, id, w.out(), timeout, "get");
  if (!r.ok()) return r.status();
  if (r->type == static_cast<uint8_t>(FrameType::store_value)) {
    return std::vector<uint8_t>(r->payload.begin() + 8, r->payload.end());
  }
  if (r->type == static_cast<uint8_t>(FrameType::store_error)) return error_of(r.value(), "get");
  return Status::error("store get: unexpected reply type " + std::to_string(r->type));
}

Status StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  uint64_t id = store_next_request_id();
  StoreWriter w;
  w.u64(id);
  w.u32(wait_ms_of(timeout));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  Result<Frame> r = request(FrameType::store_wait, id, w.out(), timeout, "wait");
  if (!r.ok()) return r.status();
  if (r->type == static_cast<uint8_t>(FrameType::store_ok)) return Status();
  if (r->type == static_cast<uint8_t>(FrameType::store_error)) return error_of(r.value(), "wait");
  return Status::error("store wait: unexpected reply type " + std::to_string(r->type));
}

Result<bool> StoreClient::wait_some(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
  uint64_t id = store_next_request_id();
  StoreWriter w;
  w.u64(id);
  w.u32(wait_ms_of(wait));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  Result<Frame> r = request(FrameType::store_wait, id, w.out(), wait, "wait");
  if (!r.ok()) return r.status();
  if (r->type == static_cast<uint8_t>(FrameType::store_ok)) return true;
  if (r->type == static_cast<uint8_t>(FrameType::store_error)) {
    StoreReader in(r->payload.data(), r->payload.size());
    in.u64();
    if (in.u32() == static_cast<uint32_t>(StoreErrorCode::timeout)) return false;
    return error_of(r.value(), "wait");
  }
  return Status::error("store wait: unexpected reply type " + std::to_string(r->type));
}

Status StoreClient::send(FrameType type, std::span<const uint8_t> payload,
                         std::chrono::milliseconds timeout) {
  const auto t = static_cast<uint8_t>(type);
  if (t >= 0x10 && t <= 0x1f) {
    return Status::error(
        "store send: frame type " + std::to_string(t) +
        " is a store request or reply; use set/get/wait (send is for one-way frames, 0x20 and up)");
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  if (std::string b = broken(); !b.empty())
    return Status::error("store send: store connection unusable: " + b);
  Status sent = frame_send(fd_, type, payload, timeout);
  if (!sent.ok()) {
    set_broken(sent.message());
    return Status::error("store send: " + sent.message());
  }
  return Status();
}

bool StoreClient::read_available() {
  for (;;) {
    uint8_t buf[4096];
    ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      decoder_.feed(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    set_broken(r == 0 ? "peer closed (the launcher's end of the socket is gone)"
                      : std::string("peer closed (") + std::strerror(errno) + ")");
    return false;
  }
}

Status StoreClient::take_frames(std::vector<Frame>* out) {
  std::lock_guard<std::mutex> lock(read_mu_);
  auto hand_out = [&] {
    for (Frame& f : unsolicited_) out->push_back(std::move(f));
    unsolicited_.clear();
  };
  if (std::string b = broken(); !b.empty()) {
    hand_out();  // what arrived before the break still counts
    return Status::error("store connection unusable: " + b);
  }
  const bool open = read_available();
  for (;;) {
    Result<std::optional<Frame>> next = decoder_.next();
    if (!next.ok()) {
      set_broken(next.error());
      break;
    }
    if (!next.value()) break;
    Frame f = std::move(*next.value());
    if (f.type >= kFirstCommandType && f.type <= kLastCommandType) {
      unsolicited_.push_back(std::move(f));
    }
    // Anything else here is a late store reply to a request an earlier call gave up on: dropped, as
    // request() drops it.
  }
  hand_out();
  if (std::string b = broken(); !open || !b.empty()) return Status::error("store connection unusable: " + b);
  return Status();
}

}  // namespace gantry
