// Runs the real gantry-engine binary in the background, for tests that act on it while it runs (kill a
// worker, send Ctrl-C): stdout and stderr go to files the test reads as they grow; wait() has a limit and
// kills the process (and with it, by PR_SET_PDEATHSIG, its workers) when it is passed.
//
//   EngineChild run = EngineChild::start({"run", "--nproc", "2", ...}, {{"GANTRY_TEST_WORKER_FAULT",
//   "1:hang_at_start"}}); ASSERT_TRUE(run.wait_for_stderr("step ", 30s));
//   ::kill(run.pid(), SIGINT);
//   EngineChild::Exit e = run.wait(30s);
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/app/engine_process.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry::testing_support {

class EngineChild {
 public:
  struct Exit {
    int code = -1;           // exit code, or -1
    int signal = 0;          // the signal that ended it
    bool timed_out = false;  // the test's limit passed and the test killed it
    double seconds = 0;      // from start to exit
  };

  static EngineChild start(const std::vector<std::string>& args,
                           const std::vector<std::pair<std::string, std::string>>& env = {}) {
    EngineChild c;
    static int serial = 0;
    const std::string base = scratch_path("child" + std::to_string(serial++)).string();
    c.out_ = base + ".stdout";
    c.err_ = base + ".stderr";
    std::vector<std::string> argv_s = {GANTRY_ENGINE_BIN};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    c.t0_ = std::chrono::steady_clock::now();
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      int in = ::open("/dev/null", O_RDONLY);
      int out = ::open(c.out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(c.err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || err < 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (std::string& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return c;
  }

  pid_t pid() const { return pid_; }
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }

  // Polls stderr until `pred` holds or `limit` passes (or the process ended); true when it held.
  bool wait_for_stderr(const std::function<bool(const std::string&)>& pred, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(err())) return true;
      if (exited_) return false;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        record(status);
        return pred(err());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // "rank R pid P" lines the launcher prints: the workers' pids, by rank.
  std::vector<pid_t> worker_pids() const {
    std::vector<pid_t> pids;
    const std::string e = err();
    static const std::regex line(R"(^rank (\d+) pid (\d+)$)", std::regex::multiline);
    for (auto it = std::sregex_iterator(e.begin(), e.end(), line); it != std::sregex_iterator(); ++it) {
      const size_t rank = std::stoul((*it)[1]);
      if (pids.size() <= rank) pids.resize(rank + 1, -1);
      pids[rank] = static_cast<pid_t>(std::stol((*it)[2]));
    }
    return pids;
  }

  Exit wait(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!exited_) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        record(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        record(status);
        exit_.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_;
  }

  ~EngineChild() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  EngineChild(EngineChild&& o) noexcept { *this = std::move(o); }
  EngineChild& operator=(EngineChild&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(exited_, o.exited_);
    std::swap(exit_, o.exit_);
    std::swap(out_, o.out_);
    std::swap(err_, o.err_);
    std::swap(t0_, o.t0_);
    return *this;
  }

 private:
  EngineChild() = default;
  void record(int status) {
    exited_ = true;
    exit_.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    exit_.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    exit_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  Exit exit_;
  std::string out_, err_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace gantry::testing_support
