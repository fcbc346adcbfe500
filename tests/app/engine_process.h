// Runs the real gantry-engine binary as a child process, as a user would, and captures what it printed.
// Output files are named after the running test, so tests of one binary can run in parallel under ctest.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry::testing_support {

struct Outcome {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Live (not zombie) children of `parents`, from /proc: the workers a launcher or an agent started.
inline std::vector<pid_t> children_of(const std::vector<pid_t>& parents) {
  std::vector<pid_t> out;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    for (pid_t p : parents)
      if (ppid == p && state != "Z") out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// `gantry-engine <args>` with stdin closed; the exit code, stdout and stderr.
inline Outcome run_engine(const std::string& args) {
  const std::string base = scratch_path("engine").string();
  const std::string out = base + ".stdout", err = base + ".stderr";
  const std::string cmd =
      std::string(GANTRY_ENGINE_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace gantry::testing_support
