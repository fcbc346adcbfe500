// The real console window for the ui tests: `gantry` (GANTRY_BIN) under a fresh Xvfb display, driven by a
// --script and read back through --dump-state, against a cluster from local_cluster.h.
//
//   if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
//   std::ofstream(dir / "script") << "wait_connected\nwait_steps 3\n";
//   EXPECT_EQ(run_gantry_script(dir, up.url, up.dir / "token", 5), 0) << slurp(dir / "gantry.err");
//   const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/ui/console/local_cluster.h"

namespace gantry::console::testing_support {

inline bool have_xvfb_run() {
  return run_shell("command -v xvfb-run >/dev/null 2>&1") == 0;
}

// `xvfb-run` with a fresh display, its X authority in `auth` (a file in the test's own folder): left to
// itself xvfb-run makes a temporary folder for it and exits 5, not with the console's code, when removing
// that folder fails (CI, session 21: "problem while cleaning up temporary directory" after the console had
// exited 1).
inline std::string xvfb_run(const fs::path& auth) {
  return "xvfb-run -a -f " + auth.string() + " -s '-screen 0 1600x1000x24' ";
}

// `gantry ARGS` (1400 × 900) under a fresh virtual display; its exit code, its stderr in `err`.
inline int run_gantry_in_xvfb(const std::string& args, const fs::path& err) {
  return run_shell(xvfb_run(err.parent_path() / "Xauthority") + std::string(GANTRY_BIN) +
                   " --width 1400 --height 900 " + args + " </dev/null >/dev/null 2>" + err.string());
}

// `gantry --connect URL` with the operator's token file, running DIR/script, then `frames` more frames, and
// writing DIR/state.json; its state folder is DIR/state and its stderr DIR/gantry.err. Its exit code.
inline int run_gantry_script(const fs::path& dir, const std::string& url, const fs::path& token_file,
                             int frames) {
  return run_gantry_in_xvfb("--connect " + url + " --token-file " + token_file.string() + " --state-dir " +
                                (dir / "state").string() + " --frames " + std::to_string(frames) +
                                " --dump-state " + (dir / "state.json").string() + " --script " +
                                (dir / "script").string(),
                            dir / "gantry.err");
}

// `gantry-engine down` of the cluster in `cluster`, then none of its daemons nor the workers may be left.
inline void down_and_expect_gone(const fs::path& cluster, const std::vector<pid_t>& daemons,
                                 const std::vector<pid_t>& workers) {
  using namespace std::chrono_literals;
  EXPECT_EQ(run_shell(std::string(GANTRY_ENGINE_BIN " down --dir ") + cluster.string() + " >/dev/null 2>&1"),
            0);
  for (pid_t p : daemons)
    EXPECT_TRUE(eventually([&] { return gone(p); }, 10s)) << "pid " << p << " left behind";
  for (pid_t p : workers)
    EXPECT_TRUE(eventually([&] { return gone(p); }, 10s)) << "worker " << p << " left behind";
}

}  // namespace gantry::console::testing_support
