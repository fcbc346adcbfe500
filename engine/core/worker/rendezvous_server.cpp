#include "engine/core/worker/rendezvous_server.h"

#include <fcntl.h>        // fcntl: non-blocking connect
#include <netdb.h>        // getaddrinfo
#include <netinet/in.h>   // sockaddr_in(6)
#include <netinet/tcp.h>  // TCP_NODELAY: store requests are small and latency-bound
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string errno_text() {
  return std::strerror(errno);
}

struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) ::freeaddrinfo(head);
  }
};

Status resolve(const HostPort& at, bool passive, AddrList* out) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string port = std::to_string(at.port);
  int rc = ::getaddrinfo(at.host.c_str(), port.c_str(), &hints, &out->head);
  if (rc != 0) {
    return Status::error("cannot resolve rendezvous host '" + at.host + "': " + ::gai_strerror(rc));
  }
  return Status();
}

Result<int> tcp_listen(const HostPort& at) {
  AddrList addrs;
  if (Status st = resolve(at, true, &addrs); !st.ok()) return st;
  std::string last = "no address";
  for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = errno_text();
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restarted job reuses its port at once
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) return fd;
    last = errno_text();
    ::close(fd);
  }
  return Status::error("cannot serve the rendezvous store on " + at.host + ":" + std::to_string(at.port) +
                       ": " + last + " (is the port in use, or the address not this host's?)");
}

}  // namespace

Result<int> rendezvous_connect(const HostPort& at, Clock::time_point deadline) {
  std::string last = "no address";
  for (;;) {
    AddrList addrs;
    Status resolved = resolve(at, false, &addrs);
    if (resolved.ok()) {
      for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
          last = errno_text();
          continue;
        }
        int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
          pollfd p = {fd, POLLOUT, 0};
          int err = ETIMEDOUT;
          if (left > 0 && ::poll(&p, 1, static_cast<int>(left)) == 1) {
            socklen_t len = sizeof err;
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          }
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc == 0) {
          // The store client polls itself; the rest of the worker expects a blocking socket.
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last = errno_text();
        ::close(fd);
      }
    } else {
      last = resolved.message();
    }
    if (Clock::now() + 100ms >= deadline) break;
    std::this_thread::sleep_for(100ms);
  }
  return Status::error("cannot reach the rendezvous store at " + at.host + ":" + std::to_string(at.port) +
                       ": " + last + " (rank 0 serves it: is rank 0 running, and the address right?)");
}

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::start(const HostPort& at) {
  Result<int> fd = tcp_listen(at);
  if (!fd.ok()) return fd.status();
  sockaddr_storage ss = {};
  socklen_t len = sizeof ss;
  int port = at.port;
  if (::getsockname(fd.value(), reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(fd.value(), port));
}

RendezvousServer::RendezvousServer(int listen_fd, int port)
    : listen_fd_(listen_fd), port_(port), server_({.on_frame = [](int, const Frame&) {}}) {
  thread_ = std::thread([this] { loop(); });
}

RendezvousServer::~RendezvousServer() {
  stop_.store(true);
  server_.wake();
  thread_.join();
  ::close(listen_fd_);
}

void RendezvousServer::wait_until_idle(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (clients_.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
}

void RendezvousServer::loop() {
  int accepted = 0;
  while (!stop_.load()) {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      server_.add_client(fd, "peer " + std::to_string(accepted++));
    }
    // Short polls: new connections wait at most this long to be accepted (the listening socket is not in
    // the server's poll set).
    if (!server_.poll_once(20ms).ok()) std::this_thread::sleep_for(20ms);
    server_.take_gone();
    clients_.store(server_.client_count());
  }
}

}  // namespace gantry
