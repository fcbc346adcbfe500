#include "engine/core/comm/store_server.h"

#include <errno.h>
#include <fcntl.h>       // pipe2 flags
#include <poll.h>        // poll: the one wait of the loop
#include <sys/socket.h>  // recv/send with MSG_DONTWAIT
#include <unistd.h>      // pipe2, read, write, close

#include <algorithm>
#include <cstring>

#include "engine/core/comm/store_protocol.h"

namespace gantry {
namespace {

// Bytes read from one client per wakeup: bounded so a client streaming a large value cannot starve the
// others within one poll round.
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadBudget = 1 << 20;

bool is_store_request(uint8_t type) {
  return type == static_cast<uint8_t>(FrameType::store_set) ||
         type == static_cast<uint8_t>(FrameType::store_get) ||
         type == static_cast<uint8_t>(FrameType::store_wait);
}

std::string key_list(const std::vector<std::string>& keys, size_t limit) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < limit; ++i) {
    if (i) s += ", ";
    s += "\"" + keys[i] + "\"";
  }
  if (keys.size() > limit) s += ", ... (" + std::to_string(keys.size() - limit) + " more)";
  return s;
}

}  // namespace

StoreServer::StoreServer(StoreServerOptions options) : options_(std::move(options)) {
  // A failed pipe2 leaves wake() a no-op; poll_once still works, just without early wakeups.
  if (::pipe2(wake_fds_, O_NONBLOCK | O_CLOEXEC) != 0) wake_fds_[0] = wake_fds_[1] = -1;
}

StoreServer::~StoreServer() {
  for (auto& [id, c] : clients_) ::close(c.fd);
  for (int fd : wake_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

int StoreServer::add_client(int fd, std::string name) {
  int id = next_client_++;
  Client& c = clients_[id];
  c.fd = fd;
  c.name = std::move(name);
  c.decoder = FrameDecoder(options_.max_payload);
  return id;
}

void StoreServer::remove_client(int client, const std::string& reason) {
  if (clients_.count(client)) drop(client, reason, /*clean=*/true);
}

void StoreServer::wake() {
  if (wake_fds_[1] < 0) return;
  const char b = 1;
  // A full pipe already guarantees a wakeup; the result is irrelevant.
  [[maybe_unused]] ssize_t w = ::write(wake_fds_[1], &b, 1);
}

Status StoreServer::send(int client, uint8_t type, std::span<const uint8_t> payload) {
  if (!clients_.count(client)) return Status::error("store server: no client " + std::to_string(client));
  queue(client, type, payload);
  return Status();
}

void StoreServer::set(const std::string& key, std::vector<uint8_t> value) {
  store_put(key, std::move(value));
}

std::optional<std::vector<uint8_t>> StoreServer::get(const std::string& key) const {
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::vector<StoreClientGone> StoreServer::take_gone() {
  std::vector<StoreClientGone> out;
  out.swap(gone_);
  return out;
}

Status StoreServer::poll_once(std::chrono::milliseconds timeout) {
  auto now = Clock::now();
  auto until = now + timeout;
  for (const auto& [w, waiter] : waiters_) until = std::min(until, waiter.deadline);
  int wait_ms = static_cast<int>(std::clamp<int64_t>(
      std::chrono::ceil<std::chrono::milliseconds>(until - now).count(), 0, 1'000'000'000));

  std::vector<pollfd> fds;
  std::vector<int> ids;
  fds.reserve(clients_.size() + 1);
  if (wake_fds_[0] >= 0) fds.push_back({wake_fds_[0], POLLIN, 0});
  for (const auto& [id, c] : clients_) {
    short events = POLLIN;
    if (c.out.size() > c.out_pos) events |= POLLOUT;
    fds.push_back({c.fd, events, 0});
    ids.push_back(id);
  }
  int rc = ::poll(fds.data(), fds.size(), wait_ms);
  if (rc < 0 && errno != EINTR)
    return Status::error(std::string("store server: poll failed: ") + std::strerror(errno));

  size_t first = 0;
  if (wake_fds_[0] >= 0) {
    first = 1;
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      char drain[64];
      while (::read(wake_fds_[0], drain, sizeof drain) > 0) {
      }
    }
  }
  for (size_t i = first; rc > 0 && i < fds.size(); ++i) {
    int id = ids[i - first];
    short ev = fds[i].revents;
    if (!ev || !clients_.count(id)) continue;  // dropped while serving an earlier client
    if (ev & POLLOUT) flush(id);
    // POLLHUP/POLLERR are read too: the recv reports EOF or the error and the reason comes from there.
    if (clients_.count(id) && (ev & (POLLIN | POLLHUP | POLLERR))) read_client(id);
  }
  expire_waiters(Clock::now());
  return Status();
}

void StoreServer::read_client(int id) {
  uint8_t buf[kReadChunk];
  size_t budget = kReadBudget;
  while (budget > 0) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return;
    Client& c = it->second;
    ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == ECONNRESET) {
        drop(id,
             c.decoder.mid_frame() ? "truncated frame: connection reset mid-frame" : "peer closed (reset)",
             !c.decoder.mid_frame(), /*peer_closed=*/true);
      } else {
        drop(id, std::string("recv failed: ") + std::strerror(errno), false);
      }
      return;
    }
    if (r == 0) {
      if (c.decoder.mid_frame()) {
        drop(id, "truncated frame: peer closed in the middle of a frame", false, /*peer_closed=*/true);
      } else {
        drop(id, "peer closed", true, /*peer_closed=*/true);
      }
      return;
    }
    budget -= std::min(budget, static_cast<size_t>(r));
    c.decoder.feed(buf, static_cast<size_t>(r));
    for (;;) {
      auto cit = clients_.find(id);
      if (cit == clients_.end()) return;
      Result<std::optional<Frame>> f = cit->second.decoder.next();
      if (!f.ok()) {
        drop(id, f.error(), false);
        return;
      }
      if (!f.value()) break;
      handle_frame(id, *f.value());
    }
  }
}

void StoreServer::handle_frame(int id, const Frame& frame) {
  if (!is_store_request(frame.type)) {
    if (frame.type >= static_cast<uint8_t>(FrameType::store_set) && frame.type <= 0x1f) {
      drop(id, "protocol error: store reply frame type " + std::to_string(frame.type) + " sent to the server",
           false);
    } else if (options_.on_frame) {
      options_.on_frame(id, frame);
    } else {
      drop(id, "protocol error: unexpected frame type " + std::to_string(frame.type), false);
    }
    return;
  }
  StoreReader in(frame.payload.data(), frame.payload.size());
  uint64_t request = in.u64();
  if (!in.ok()) {
    drop(id,
         "protocol error: store request of " + std::to_string(frame.payload.size()) +
             " bytes has no request id",
         false);
    return;
  }
  auto bad = [&](const std::string& why) {
    reply_error(id, request, static_cast<uint32_t>(StoreErrorCode::bad_request), why);
  };

  if (frame.type == static_cast<uint8_t>(FrameType::store_set)) {
    std::string key = in.str();
    if (!in.ok()) return bad("malformed set request");
    handle_set(id, request, key, in.rest());
    return;
  }

  uint32_t wait_ms = in.u32();
  std::vector<std::string> keys;
  if (frame.type == static_cast<uint8_t>(FrameType::store_get)) {
    keys.push_back(in.str());
  } else {
    uint32_t count = in.u32();
    // Each key takes at least its 4-byte length; a count beyond that is a lie, not an allocation request.
    if (!in.ok() || count > in.left() / 4) return bad("malformed wait request");
    for (uint32_t i = 0; i < count; ++i) keys.push_back(in.str());
  }
  if (!in.ok() || in.left() != 0) return bad("malformed get/wait request");
  for (const auto& k : keys) {
    if (k.empty() || k.size() > options_.max_key_bytes) {
      return bad("key of " + std::to_string(k.size()) + " bytes (allowed 1.." +
                 std::to_string(options_.max_key_bytes) + ")");
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  size_t missing = 0;
  for (const auto& k : keys) missing += data_.count(k) ? 0 : 1;
  const bool is_get = frame.type == static_cast<uint8_t>(FrameType::store_get);

  if (missing == 0) {
    if (is_get) {
      reply_value(id, request, data_.at(keys[0]));
    } else {
      reply_ok(id, request);
    }
    return;
  }
  if (wait_ms == 0) {
    if (is_get) {
      reply_error(id, request, static_cast<uint32_t>(StoreErrorCode::not_found),
                  "key \"" + keys[0] + "\" is not set");
    } else {
      std::vector<std::string> absent;
      for (const auto& k : keys) {
        if (!data_.count(k)) absent.push_back(k);
      }
      reply_error(id, request, static_cast<uint32_t>(StoreErrorCode::timeout),
                  "keys not set: " + key_list(absent, 8));
    }
    return;
  }
  Client& c = clients_.at(id);
  if (c.pending >= options_.max_pending_per_client) {
    return bad("too many pending requests (" + std::to_string(c.pending) + ")");
  }
  uint64_t w = next_waiter_++;
  Waiter& waiter = waiters_[w];
  waiter.client = id;
  waiter.request = request;
  waiter.is_get = is_get;
  waiter.keys = std::move(keys);
  waiter.missing = missing;
  waiter.start = Clock::now();
  waiter.deadline = waiter.start + std::chrono::milliseconds(wait_ms);
  for (const auto& k : waiter.keys) {
    if (!data_.count(k)) waiting_on_[k].push_back(w);
  }
  ++c.pending;
}

void StoreServer::handle_set(int id, uint64_t request, const std::string& key, std::vector<uint8_t> value) {
  if (key.empty() || key.size() > options_.max_key_bytes) {
    reply_error(id, request, static_cast<uint32_t>(StoreErrorCode::bad_request),
                "key of " + std::to_string(key.size()) + " bytes (allowed 1.." +
                    std::to_string(options_.max_key_bytes) + ")");
    return;
  }
  size_t old = 0;
  if (auto it = data_.find(key); it != data_.end()) old = key.size() + it->second.size();
  if (data_bytes_ - old + key.size() + value.size() > options_.max_store_bytes) {
    reply_error(id, request, static_cast<uint32_t>(StoreErrorCode::too_large),
                "setting \"" + key + "\" (" + std::to_string(value.size()) +
                    " bytes) would exceed the store's " + std::to_string(options_.max_store_bytes) +
                    " bytes");
    return;
  }
  // Reply before waking waiters: the setter learns its write landed even if a waiter's reply overflows.
  reply_ok(id, request);
  store_put(key, std::move(value));
}

void StoreServer::store_put(const std::string& key, std::vector<uint8_t> value) {
  auto it = data_.find(key);
  if (it != data_.end()) {
    data_bytes_ -= key.size() + it->second.size();
    it->second = std::move(value);
    data_bytes_ += key.size() + it->second.size();
    return;  // an overwrite wakes nobody: waiters only wait for absent keys
  }
  data_bytes_ += key.size() + value.size();
  data_.emplace(key, std::move(value));
  auto wit = waiting_on_.find(key);
  if (wit == waiting_on_.end()) return;
  std::vector<uint64_t> ws = std::move(wit->second);
  waiting_on_.erase(wit);
  for (uint64_t w : ws) {
    auto it2 = waiters_.find(w);
    if (it2 == waiters_.end()) continue;
    if (--it2->second.missing == 0) finish_waiter(w);
  }
}

void StoreServer::finish_waiter(uint64_t w) {
  auto it = waiters_.find(w);
  if (it == waiters_.end()) return;
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  if (auto c = clients_.find(waiter.client); c != clients_.end()) --c->second.pending;
  if (waiter.is_get) {
    reply_value(waiter.client, waiter.request, data_.at(waiter.keys[0]));
  } else {
    reply_ok(waiter.client, waiter.request);
  }
}

void StoreServer::expire_waiters(Clock::time_point now) {
  std::vector<uint64_t> overdue;
  for (const auto& [w, waiter] : waiters_) {
    if (waiter.deadline <= now) overdue.push_back(w);
  }
  for (uint64_t w : overdue) {
    Waiter waiter = std::move(waiters_.at(w));
    waiters_.erase(w);
    std::vector<std::string> absent;
    for (const auto& k : waiter.keys) {
      if (!data_.count(k)) {
        absent.push_back(k);
        auto& list = waiting_on_[k];
        list.erase(std::remove(list.begin(), list.end(), w), list.end());
        if (list.empty()) waiting_on_.erase(k);
      }
    }
    auto c = clients_.find(waiter.client);
    if (c == clients_.end()) continue;
    --c->second.pending;
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - waiter.start).count();
    reply_error(waiter.client, waiter.request, static_cast<uint32_t>(StoreErrorCode::timeout),
                "timed out after " + std::to_string(waited) + " ms waiting for " + key_list(absent, 8) +
                    " (" + std::to_string(waiter.keys.size() - absent.size()) + " of " +
                    std::to_string(waiter.keys.size()) + " keys set)");
  }
}

void StoreServer::reply_ok(int id, uint64_t request) {
  StoreWriter w;
  w.u64(request);
  queue(id, static_cast<uint8_t>(FrameType::store_ok), w.out());
}

void StoreServer::reply_value(int id, uint64_t request, const std::vector<uint8_t>& value) {
  StoreWriter w;
  w.u64(request);
  w.bytes(value.data(), value.size());
  queue(id, static_cast<uint8_t>(FrameType::store_value), w.out());
}

void StoreServer::reply_error(int id, uint64_t request, uint32_t code, const std::string& message) {
  StoreWriter w;
  w.u64(request);
  w.u32(code);
  w.bytes(message.data(), message.size());
  queue(id, static_cast<uint8_t>(FrameType::store_error), w.out());
}

void StoreServer::queue(int id, uint8_t type, std::span<const uint8_t> payload) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (c.out.size() - c.out_pos + kFrameHeaderBytes + payload.size() > options_.max_queued_bytes) {
    drop(id, "not reading its replies (" + std::to_string(c.out.size() - c.out_pos) + " bytes queued)",
         false);
    return;
  }
  uint8_t header[kFrameHeaderBytes];
  frame_header_encode(type, static_cast<uint32_t>(payload.size()), header);
  c.out.insert(c.out.end(), header, header + kFrameHeaderBytes);
  c.out.insert(c.out.end(), payload.begin(), payload.end());
  flush(id);
}

void StoreServer::flush(int id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  while (c.out_pos < c.out.size()) {
    ssize_t w = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      c.out_pos += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // poll_once asks for POLLOUT
    // EPIPE/ECONNRESET: the worker is gone. Its EOF may still be unread; reporting it here is equivalent.
    drop(id, std::string("peer closed (send: ") + std::strerror(errno) + ")", true);
    return;
  }
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  }
}

void StoreServer::drop(int id, std::string reason, bool clean, bool peer_closed) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  ::close(it->second.fd);
  gone_.push_back({id, it->second.name, std::move(reason), clean, peer_closed});
  clients_.erase(it);
  // Its waits can never be answered; leave no dangling waiter to time out against a missing client.
  std::vector<uint64_t> own;
  for (const auto& [w, waiter] : waiters_) {
    if (waiter.client == id) own.push_back(w);
  }
  for (uint64_t w : own) {
    for (const auto& k : waiters_.at(w).keys) {
      auto lit = waiting_on_.find(k);
      if (lit == waiting_on_.end()) continue;
      auto& list = lit->second;
      list.erase(std::remove(list.begin(), list.end(), w), list.end());
      if (list.empty()) waiting_on_.erase(lit);
    }
    waiters_.erase(w);
  }
}

}  // namespace gantry
