// Runs the real gantry-engine binary as a child process, as a user would, and captures what it printed.
// Output files are named after the running test, so tests of one binary can run in parallel under ctest.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace gantry::testing_support {

struct Outcome {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `gantry-engine <args>` with stdin closed; the exit code, stdout and stderr.
inline Outcome run_engine(const std::string& args) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string base = ::testing::TempDir() + "/gantry_" + test->test_suite_name() + "_" + test->name() + "_" +
                           std::to_string(getpid());
  const std::string out = base + ".stdout", err = base + ".stderr";
  const std::string cmd = std::string(GANTRY_ENGINE_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace gantry::testing_support
