// An alert rule's command hook (e.g. a script that pages someone): `/bin/sh -c COMMAND` in a process group
// of its own, with the alert in its environment (GANTRY_ALERT_RULE, _RUN, _VALUE, _MESSAGE), its output
// appended to a log file, and a bounded time: past its timeout the whole group is killed (SIGKILL), so a
// hook that hangs, or leaves a child behind, costs the coordinator nothing but a thread for that time.
//
//   AlertHooks hooks("/cluster/alert_hooks.log");
//   hooks.start("page-oncall", 10.0, {{"GANTRY_ALERT_RULE", "loss_high"}},
//               [](const AlertHookResult& r) { record(r.text()); });  // called on the hook's thread
//   ...
//   hooks.stop();  // kills what still runs and joins
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gantry {

struct AlertHookResult {
  enum class End { kExited, kSignalled, kTimedOut, kNotStarted };
  End end = End::kNotStarted;
  int code = 0;  // the exit status (kExited) or the signal (kSignalled)
  double seconds = 0;
  std::string error;  // kNotStarted: why
  // "exited with status 0 after 0.01 s", "killed after its 2 s timeout", "could not start: ..."
  std::string text(double timeout_s) const;
};

class AlertHooks {
 public:
  explicit AlertHooks(std::string log_path) : log_path_(std::move(log_path)) {}
  ~AlertHooks() { stop(); }
  AlertHooks(const AlertHooks&) = delete;
  AlertHooks& operator=(const AlertHooks&) = delete;

  // Runs `command` on a thread of its own; `done` is called there once it ended or was killed.
  void start(const std::string& command, double timeout_s,
             std::vector<std::pair<std::string, std::string>> env,
             std::function<void(const AlertHookResult&)> done);
  // Kills the hooks still running (their `done` says so) and joins their threads.
  void stop();

  // Runs one hook on the calling thread (what start() does on its own): for tests and the thread.
  static AlertHookResult run(const std::string& command, double timeout_s,
                             const std::vector<std::pair<std::string, std::string>>& env,
                             const std::string& log_path, const std::atomic<bool>* stopping = nullptr);

 private:
  std::string log_path_;
  std::mutex mu_;
  struct Running {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // joined at the next start() once set: threads do not pile up
  };
  std::vector<Running> threads_;
  std::atomic<bool> stopping_{false};
};

}  // namespace gantry
