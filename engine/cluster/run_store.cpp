#include "engine/cluster/run_store.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace gantry {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::atomic<uint64_t> g_started{0};  // a unique port file for each store this process starts

// Every descriptor past stderr, closed in the store's process before exec: the coordinator's listening
// socket must not live on in a store that outlives it (a restarted coordinator binds the same port).
void close_inherited(long max_fd) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3u, ~0u, 0u) == 0) return;
#endif
  for (long fd = 3; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
}

}  // namespace

Result<std::unique_ptr<RunStore>> RunStore::start(const std::string& exe, const std::string& host,
                                                  const std::string& log) {
  std::unique_ptr<RunStore> s(new RunStore());
  if (exe.empty()) {
    Result<std::unique_ptr<RendezvousServer>> local = RendezvousServer::start({host, 0});
    if (!local.ok()) return local.status();
    s->local_ = std::move(local.value());
    s->port_ = s->local_->port();
    return s;
  }
  const std::string port_file =
      log + "." + std::to_string(::getpid()) + "-" + std::to_string(g_started.fetch_add(1)) + ".port";
  std::vector<std::string> args = {exe, "rendezvous-store", "--host", host, "--port-file", port_file};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const long max_fd = std::min<long>(::sysconf(_SC_OPEN_MAX) > 0 ? ::sysconf(_SC_OPEN_MAX) : 1024, 65536);
  // Twice forked: the store is nobody's child (no zombie for the coordinator to reap, and the coordinator's
  // death leaves it running), in a session of its own (a terminal's Ctrl-C is the coordinator's).
  const pid_t child = ::fork();
  if (child < 0)
    return Status::error(std::string("cannot start the run's rendezvous store: fork: ") +
                         std::strerror(errno));
  if (child == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    close_inherited(max_fd);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const auto deadline = Clock::now() + 10s;
  for (;;) {
    std::ifstream in(port_file);
    int port = 0;
    int64_t pid = 0;
    if (in >> port >> pid && port > 0) {
      std::error_code ec;
      fs::remove(port_file, ec);
      s->port_ = port;
      s->pid_ = pid;
      return s;
    }
    if (Clock::now() > deadline) {
      return Status::error("cannot start the run's rendezvous store (" + exe +
                           " rendezvous-store): it did not say its port within 10 s; see " + log);
    }
    std::this_thread::sleep_for(10ms);
  }
}

Status run_store_main(const RunStoreProcessOptions& o, const std::atomic<bool>* stop) {
  Result<std::unique_ptr<RendezvousServer>> server = RendezvousServer::start({o.host, 0});
  if (!server.ok()) return server.status();
  RendezvousServer& s = *server.value();
  {
    // Written whole and renamed: the coordinator never reads half a line.
    const std::string tmp = o.port_file + ".tmp";
    std::ofstream(tmp) << s.port() << " " << ::getpid() << "\n";
    std::error_code ec;
    fs::rename(tmp, o.port_file, ec);
    if (ec) return Status::error("cannot write " + o.port_file + ": " + ec.message());
  }
  std::fprintf(stderr, "gantry-engine rendezvous-store: serving %s:%d\n", o.host.c_str(), s.port());
  bool had_client = false;
  auto idle_since = Clock::now();
  while (stop == nullptr || !stop->load()) {
    std::this_thread::sleep_for(50ms);
    if (s.clients() > 0) {
      had_client = true;
      idle_since = Clock::now();
      continue;
    }
    const auto idle = Clock::now() - idle_since;
    if (had_client && idle > o.linger) {
      std::fprintf(stderr, "gantry-engine rendezvous-store %d: its gang has gone; exiting\n", s.port());
      break;
    }
    if (!had_client && idle > o.no_client_limit) {
      std::fprintf(stderr, "gantry-engine rendezvous-store %d: no worker came; exiting\n", s.port());
      break;
    }
  }
  return Status();
}

}  // namespace gantry
