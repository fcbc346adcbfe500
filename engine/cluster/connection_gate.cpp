#include "engine/cluster/connection_gate.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

void close_socket(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

// "POST /v1/agents%2F?x=1 HTTP/1.1\r\n..." -> "POST /v1/agents": the target the router will see, so that
// spellings of one route are one target.
std::string target_of(std::string_view head) {
  const size_t space = head.find(' ');
  if (space == std::string_view::npos) return std::string(head.substr(0, head.find("\r\n")));
  const size_t end = head.find_first_of(" ?#\r", space + 1);
  const std::string_view raw = head.substr(space + 1, end == std::string_view::npos ? end : end - space - 1);
  std::string out(head.substr(0, space + 1));
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '%' && i + 2 < raw.size() && hex(raw[i + 1]) >= 0 && hex(raw[i + 2]) >= 0) {
      out += static_cast<char>(hex(raw[i + 1]) * 16 + hex(raw[i + 2]));
      i += 2;
    } else {
      out += raw[i];
    }
  }
  while (out.size() > space + 2 && out.back() == '/') out.pop_back();
  return out;
}

}  // namespace

struct ConnectionGate::Impl {
  struct Waiting {
    Clock::time_point deadline;
    uint64_t order = 0;   // admission order: the oldest is evicted first
    bool parked = false;  // its header is whole, but a request for its target is being served
  };
  struct Job {
    int fd = -1;
    size_t header_bytes = 0;
    std::string target;  // held in `serving` while served; "" where the lane is not one_per_target
  };
  struct Lane {
    std::deque<Job> ready;
    std::condition_variable cv;
    std::vector<std::thread> threads;
  };

  ConnectionGateOptions opt;
  Serve serve;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread poller;
  std::atomic<bool> stopping{false};
  bool started = false;

  mutable std::mutex mu;  // everything below
  std::unordered_map<int, Waiting> waiting;
  uint64_t next_order = 0;
  Lane lanes[2];
  std::unordered_set<std::string> serving;  // one_per_target lanes: targets being served
  ConnectionGateStats counts;

  // Stops watching `fd` and forgets it (hold mu). The caller closes it or hands it on.
  void forget(int fd) {
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    waiting.erase(fd);
  }

  // Looks at what `fd` has sent so far, without taking it off the socket (hold mu).
  void examine(int fd, std::vector<char>& buf) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {  // the client went away (or the socket broke) before a whole header
      forget(fd);
      ::close(fd);
      return;
    }
    const std::string_view head(buf.data(), static_cast<size_t>(n));
    const size_t end = head.find("\r\n\r\n");
    if (end == std::string_view::npos) {
      if (static_cast<size_t>(n) < opt.max_header_bytes) return;  // more is on its way
      static const std::string kTooLarge = [] {
        const std::string body = "{\"error\":\"request header too large\"}";
        return "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
               "Connection: close\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      ::send(fd, kTooLarge.data(), kTooLarge.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ++counts.too_large;
      forget(fd);
      close_socket(fd);
      return;
    }
    int lane = opt.lane_of ? opt.lane_of(head.substr(0, std::min<size_t>(head.size(), 256))) : 0;
    lane = lane == 1 ? 1 : 0;
    std::string target;
    if (opt.one_per_target[lane]) {
      target = target_of(head.substr(0, end));
      if (serving.count(target)) {
        waiting[fd].parked = true;  // looked at again when that request is done (lane_loop)
        return;
      }
      serving.insert(target);
    }
    forget(fd);
    ++counts.served;
    lanes[lane].ready.push_back(Job{.fd = fd, .header_bytes = end + 4, .target = std::move(target)});
    lanes[lane].cv.notify_one();
  }

  void poll_loop() {
    std::vector<char> buf(opt.max_header_bytes);
    epoll_event events[64];
    while (!stopping.load()) {
      int timeout_ms = 200;
      {
        std::lock_guard<std::mutex> lock(mu);
        const Clock::time_point now = Clock::now();
        for (const auto& [fd, w] : waiting) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - now).count();
          timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
        }
      }
      const int n = ::epoll_wait(epoll_fd, events, 64, timeout_ms);
      std::lock_guard<std::mutex> lock(mu);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof v);
          continue;
        }
        // An event for a descriptor no longer waiting (served, evicted, or its number reused by a
        // connection admitted since) is looked at only if that descriptor waits now: a peek is harmless.
        if (waiting.count(fd)) examine(fd, buf);
      }
      const Clock::time_point now = Clock::now();
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        const int fd = it->first;
        ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
        it = waiting.erase(it);
        close_socket(fd);
        ++counts.timed_out;
      }
    }
  }

  void lane_loop(int lane) {
    Lane& l = lanes[lane];
    std::vector<char> buf(opt.max_header_bytes);  // for the parked connections' second look
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        l.cv.wait(lock, [&] { return stopping.load() || !l.ready.empty(); });
        if (stopping.load()) return;
        job = std::move(l.ready.front());
        l.ready.pop_front();
      }
      bool keep = false;
      try {
        keep = serve(job.fd, job.header_bytes);
      } catch (...) {
        keep = false;  // the server answers its own errors; whatever escapes ends the connection only
      }
      if (!job.target.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        serving.erase(job.target);
        std::vector<int> parked;
        for (auto& [fd, w] : waiting) {
          if (w.parked) parked.push_back(fd);
        }
        for (int fd : parked) {  // the first for this target is served; the others park again
          waiting[fd].parked = false;
          examine(fd, buf);
        }
      }
      if (keep && !stopping.load()) {
        admit_again(job.fd);
      } else {
        close_socket(job.fd);
      }
    }
  }

  void watch(int fd, bool first) {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping.load()) {
      close_socket(fd);
      return;
    }
    ++counts.admitted;
    if (waiting.size() >= opt.max_waiting) {
      auto oldest = std::min_element(waiting.begin(), waiting.end(), [](const auto& a, const auto& b) {
        return a.second.order < b.second.order;
      });
      const int victim = oldest->first;
      forget(victim);
      close_socket(victim);
      ++counts.evicted;
    }
    const auto wait = first ? opt.header_timeout : opt.keep_alive_timeout;
    waiting[fd] = Waiting{.deadline = Clock::now() + wait, .order = next_order++};
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    // Edge-triggered: bytes already waiting raise one event at once; each later arrival raises another.
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      waiting.erase(fd);
      close_socket(fd);
    }
  }

  void admit_again(int fd) { watch(fd, false); }
};

ConnectionGate::ConnectionGate(ConnectionGateOptions options, Serve serve) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->serve = std::move(serve);
}

ConnectionGate::~ConnectionGate() {
  stop();
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

Status ConnectionGate::start() {
  Impl& g = *impl_;
  if (g.started) return Status::error("connection gate: already started");
  for (int lane = 0; lane < 2; ++lane) {
    if (g.opt.threads[lane] < 1)
      return Status::error("connection gate: every lane needs at least one thread");
  }
  if (g.opt.max_waiting < 1 || g.opt.max_header_bytes < 64) {
    return Status::error("connection gate: max_waiting must be at least 1 and max_header_bytes at least 64");
  }
  g.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  g.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g.epoll_fd < 0 || g.wake_fd < 0)
    return Status::error(std::string("connection gate: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = g.wake_fd;
  ::epoll_ctl(g.epoll_fd, EPOLL_CTL_ADD, g.wake_fd, &ev);
  g.started = true;
  g.poller = std::thread([&g] { g.poll_loop(); });
  for (int lane = 0; lane < 2; ++lane) {
    for (int t = 0; t < g.opt.threads[lane]; ++t)
      g.lanes[lane].threads.emplace_back([&g, lane] { g.lane_loop(lane); });
  }
  return Status();
}

void ConnectionGate::admit(int fd) {
  impl_->watch(fd, true);
}

void ConnectionGate::stop() {
  Impl& g = *impl_;
  if (!g.started) return;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.stopping.exchange(true)) return;
    for (Impl::Lane& l : g.lanes) l.cv.notify_all();
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(g.wake_fd, &one, sizeof one);
  if (g.poller.joinable()) g.poller.join();
  for (Impl::Lane& l : g.lanes) {
    for (std::thread& t : l.threads) t.join();
    l.threads.clear();
  }
  std::lock_guard<std::mutex> lock(g.mu);
  for (const auto& [fd, w2] : g.waiting) close_socket(fd);
  g.waiting.clear();
  for (Impl::Lane& l : g.lanes) {
    for (const Impl::Job& job : l.ready) close_socket(job.fd);
    l.ready.clear();
  }
}

ConnectionGateStats ConnectionGate::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ConnectionGateStats s = impl_->counts;
  s.waiting = impl_->waiting.size();
  return s;
}

}  // namespace gantry
