#include "engine/cluster/alert_hook.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

extern char** environ;  // the coordinator's environment, passed on to its hooks

namespace gantry {
namespace {

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

std::string AlertHookResult::text(double timeout_s) const {
  switch (end) {
    case End::kExited:
      return "exited with status " + std::to_string(code) + " after " + secs(seconds);
    case End::kSignalled:
      return "was killed by signal " + std::to_string(code) + " after " + secs(seconds);
    case End::kTimedOut:
      return "was killed after its " + secs(timeout_s) + " timeout";
    case End::kNotStarted:
      return "could not start: " + error;
  }
  return "?";
}

AlertHookResult AlertHooks::run(const std::string& command, double timeout_s,
                                const std::vector<std::pair<std::string, std::string>>& env,
                                const std::string& log_path, const std::atomic<bool>* stopping) {
  using Clock = std::chrono::steady_clock;
  AlertHookResult out;
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  const int log = ::open(log_path.empty() ? "/dev/null" : log_path.c_str(),
                         O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    out.error = std::string("fork: ") + std::strerror(errno);
    if (log >= 0) ::close(log);
    if (devnull >= 0) ::close(devnull);
    return out;
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // a group of its own: the timeout kills the hook and whatever it started
    if (devnull >= 0) ::dup2(devnull, 0);
    if (log >= 0) {
      ::dup2(log, 1);
      ::dup2(log, 2);
    }
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before it is signalled
  if (log >= 0) ::close(log);
  if (devnull >= 0) ::close(devnull);
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      out.error = std::string("waitpid: ") + std::strerror(errno);
      return out;
    }
    if (Clock::now() >= deadline || (stopping && stopping->load())) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      out.end = AlertHookResult::End::kTimedOut;
      out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The hook is gone; anything it left in its group goes too (a pager script's stray child).
  ::kill(-pid, SIGKILL);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (WIFEXITED(status)) {
    out.end = AlertHookResult::End::kExited;
    out.code = WEXITSTATUS(status);
  } else {
    out.end = AlertHookResult::End::kSignalled;
    out.code = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  return out;
}

void AlertHooks::start(const std::string& command, double timeout_s,
                       std::vector<std::pair<std::string, std::string>> env,
                       std::function<void(const AlertHookResult&)> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return;
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (!it->done->load()) {
      ++it;
      continue;
    }
    it->thread.join();
    it = threads_.erase(it);
  }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, command, timeout_s, env = std::move(env), done = std::move(done), finished] {
    const AlertHookResult r = run(command, timeout_s, env, log_path_, &stopping_);
    if (done) done(r);
    finished->store(true);
  });
  threads_.push_back({std::move(t), std::move(finished)});
}

void AlertHooks::stop() {
  std::vector<Running> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_.store(true);
    threads.swap(threads_);
  }
  for (Running& r : threads) r.thread.join();
}

}  // namespace gantry
