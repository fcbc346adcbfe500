// Runs the real gantry-engine binary as a child process, as a user would, and captures what it printed.
// Output files are named after the running test, so tests of one binary can run in parallel under ctest.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
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
      std::string(GANTRY_ENGINE_BIN " ") + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// tiny.toml's GPT at half its width and half its context (n_embd 32, seq_len 32; the same 2 layers, 4 heads,
// batch, optimizer and data): about a fifth of the CPU a step (4 ranks x 40 steps, one thread a rank: 3 s
// user against 17 s). For a test whose runs are compared only with runs of the same config (a run against
// itself: the shape is free) or that needs only steps, not what the model learns, and whose waits count
// steps (no margin in steps changes; where rank 0 is slowed, a step still lasts at least its delay).
inline std::string small_model(std::string toml) {
  toml = std::regex_replace(toml, std::regex("n_embd = \\d+"), "n_embd = 32");
  return std::regex_replace(toml, std::regex("seq_len = \\d+"), "seq_len = 32");
}

}  // namespace gantry::testing_support
