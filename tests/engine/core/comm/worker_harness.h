// Test support for communicator tests across real processes: fork N workers, each holding one end of a
// socketpair whose other end the parent serves with a StoreServer (the launcher's role), collect what
// each worker reports, and reap every child (a worker still running at the limit is killed, and the
// result says so). Workers return "" when all their checks passed, else what failed.
//
//   RunResult res = run_workers(3, [](int rank, int n, int store_fd) -> std::string { ... });
//   expect_all_passed(res);
//
// The parent must not have initialised CUDA before forking (CUDA does not survive fork): GPU tests probe
// for devices in a child of their own (exit_code_in_child).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/comm/store_server.h"
#include "engine/core/rng.h"
#include "telemetry/status.h"

namespace gantry {
namespace comm_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Outcome {
  pid_t pid = -1;
  bool exited = false;  // normal exit (else a signal, or killed by the harness)
  int code = -1;
  int signal = 0;
  bool killed_by_harness = false;
  std::string report;  // what the worker said; empty = all its checks passed
};

struct RunResult {
  std::vector<Outcome> workers;
  std::vector<StoreClientGone> gone;
};

inline void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

// Forks n workers running body(rank, n, store_fd) and serves their store until all have exited. A
// worker still alive after `limit` is killed and the result says so. Every child is reaped here.
inline RunResult run_workers(int n, const std::function<std::string(int, int, int)>& body,
                             std::chrono::milliseconds limit = 20s) {
  RunResult res;
  res.workers.resize(static_cast<size_t>(n));
  std::vector<int> store_fds, report_fds;
  for (int r = 0; r < n; ++r) {
    int sp[2], rp[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0 || ::pipe(rp) != 0) {
      ADD_FAILURE() << "socketpair/pipe: " << std::strerror(errno);
      break;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
      // The worker keeps only its own ends: the launcher's ends must close when the launcher does.
      for (int fd : store_fds) ::close(fd);
      for (int fd : report_fds) ::close(fd);
      ::close(sp[0]);
      ::close(rp[0]);
      std::string report;
      try {
        report = body(r, n, sp[1]);
      } catch (const std::exception& e) {
        report = std::string("exception: ") + e.what();
      }
      if (report.size() > 4000) report.resize(4000);  // stays within the pipe: the parent reads after exit
      write_all(rp[1], report);
      ::_exit(report.empty() ? 0 : 1);  // _exit: no gtest teardown, no atexit handlers in the child
    }
    ::close(sp[1]);
    ::close(rp[1]);
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      ::close(sp[0]);
      ::close(rp[0]);
      break;
    }
    res.workers[static_cast<size_t>(r)].pid = pid;
    store_fds.push_back(sp[0]);
    report_fds.push_back(rp[0]);
  }

  StoreServer server;
  for (size_t r = 0; r < store_fds.size(); ++r) server.add_client(store_fds[r], "rank " + std::to_string(r));
  const auto deadline = Clock::now() + limit;
  size_t alive = store_fds.size();
  std::vector<bool> reaped(store_fds.size(), false);
  auto record = [&](size_t r, int status) {
    Outcome& o = res.workers[r];
    o.exited = WIFEXITED(status);
    o.code = o.exited ? WEXITSTATUS(status) : -1;
    o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    reaped[r] = true;
    --alive;
  };
  while (alive > 0 && Clock::now() < deadline) {
    Status st = server.poll_once(10ms);
    if (!st.ok()) ADD_FAILURE() << st.message();
    for (auto& g : server.take_gone()) res.gone.push_back(g);
    for (size_t r = 0; r < reaped.size(); ++r) {
      int status;
      if (!reaped[r] && ::waitpid(res.workers[r].pid, &status, WNOHANG) == res.workers[r].pid)
        record(r, status);
    }
  }
  for (size_t r = 0; r < reaped.size(); ++r) {
    if (reaped[r]) continue;
    ::kill(res.workers[r].pid, SIGKILL);
    int status;
    ::waitpid(res.workers[r].pid, &status, 0);
    record(r, status);
    res.workers[r].killed_by_harness = true;
  }
  for (size_t r = 0; r < report_fds.size(); ++r) {
    char buf[4096];
    ssize_t got;
    while ((got = ::read(report_fds[r], buf, sizeof buf)) > 0)
      res.workers[r].report.append(buf, static_cast<size_t>(got));
    ::close(report_fds[r]);
    // Reaped means gone: no pid may still name a process (zombie or running) after the harness.
    errno = 0;
    EXPECT_EQ(::kill(res.workers[r].pid, 0), -1);
    EXPECT_EQ(errno, ESRCH) << "worker " << r << " (pid " << res.workers[r].pid << ") left behind";
  }
  for (auto& g : server.take_gone()) res.gone.push_back(g);
  return res;
}

inline void expect_all_passed(const RunResult& res) {
  for (size_t r = 0; r < res.workers.size(); ++r) {
    const Outcome& o = res.workers[r];
    EXPECT_FALSE(o.killed_by_harness) << "rank " << r << " hung";
    EXPECT_TRUE(o.exited && o.code == 0)
        << "rank " << r << " exit " << o.code << " signal " << o.signal << ": " << o.report;
  }
}

// Per-rank test data: uniform in [-1, 1), reproducible from (rank, count, tag) in any process.
inline std::vector<float> rank_data(int rank, size_t count, uint64_t tag) {
  Rng rng{0x5EED0000ull + 7919ull * static_cast<uint64_t>(rank) + 104729ull * tag + count};
  std::vector<float> v(count);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  return v;
}

// "" when equal bit for bit, else where they first differ.
inline std::string diff_bits(const float* got, const float* want, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, got + i, 4);
    std::memcpy(&b, want + i, 4);
    if (a != b) {
      char buf[200];
      std::snprintf(buf, sizeof buf, ": element %zu of %zu is %.9g (0x%08x), expected %.9g (0x%08x)\n", i, n,
                    static_cast<double>(got[i]), a, static_cast<double>(want[i]), b);
      return what + buf;
    }
  }
  return "";
}

// In a worker body: return the failure (the expression and its message) when `expr` is not ok.
#define WORKER_CHECK_OK(expr)                                             \
  do {                                                                    \
    ::gantry::Status st_ = (expr);                                        \
    if (!st_.ok()) return std::string(#expr " failed: ") + st_.message(); \
  } while (0)

// Runs `probe` in a child process and returns its exit code (or -1): how a GPU test asks CUDA how many
// devices there are without initialising CUDA in the parent it will fork workers from.
inline int exit_code_in_child(const std::function<int()>& probe) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(probe());
  if (pid < 0) return -1;
  int status;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace comm_test
}  // namespace gantry
