// A real local cluster for the console's integration tests: `gantry-engine up` in a fresh folder
// (a coordinator and two agents of two slots, real processes on loopback), and on teardown `down` and a
// check, by pid, that none of them nor any worker is left. The test process makes itself their
// subreaper, so the daemons `up` detaches are reaped here and "gone" means gone.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine/cluster/token.h"
#include "tests/app/engine_process.h"
#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry::console::testing_support {

namespace fs = std::filesystem;

using gantry::testing_support::slurp;

// Polls `pred` every 50 ms until it holds or `limit` passes (a guard against hanging, not a measurement).
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

// Reaped (we are the subreaper), or no such process.
inline bool gone(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == pid) return true;
  errno = 0;
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

using gantry::testing_support::children_of;  // tests/app/engine_process.h

// The pids in `dir`'s *.pid files (the coordinator's and the agents').
inline std::vector<pid_t> pid_files(const fs::path& dir) {
  std::vector<pid_t> out;
  if (!fs::exists(dir)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".pid") out.push_back(static_cast<pid_t>(std::stol(slurp(e.path()))));
  return out;
}

// Runs a shell command line; its exit code (-1 when it did not exit).
inline int run_shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A unique scratch folder per test.
inline fs::path scratch_dir(const char* what) {
  return gantry::testing_support::scratch_dir(what);
}

inline void become_subreaper() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

// A cluster started by `gantry-engine up <args> --dir <dir>/cluster` (its output in <dir>/up.out and
// up.err): the daemons' pids, the coordinator's URL and the operator's token. `error` says why not
// (up's stderr, or the token file's problem); empty when it started.
struct UpCluster {
  fs::path dir;  // <dir>/cluster
  std::vector<pid_t> daemons;
  std::string url, token, error;
};
inline UpCluster up_cluster(const fs::path& dir, const std::string& args) {
  UpCluster c{.dir = dir / "cluster"};
  if (run_shell(std::string(GANTRY_ENGINE_BIN " up ") + args + " --dir " + c.dir.string() + " >" +
                (dir / "up.out").string() + " 2>" + (dir / "up.err").string()) != 0) {
    c.error = "up failed: " + slurp(dir / "up.err");
    return c;
  }
  c.daemons = pid_files(c.dir);
  c.url = slurp(dir / "up.out");
  c.url = c.url.substr(0, c.url.find('\n'));
  Result<std::string> token = token_file_read((c.dir / "token").string());
  if (token.ok()) {
    c.token = token.value();
  } else {
    c.error = token.error();
  }
  return c;
}

}  // namespace gantry::console::testing_support
