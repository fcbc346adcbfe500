// The Devices panel in the real window: `gantry` under Xvfb against a real `up` cluster whose agents sample
// their nodes (engine/cluster/device_sampler.h). Through --script and --dump-state: the panel shows the
// node CPU series of both nodes, drawn as the band and the heatmap; GPU rows only where NVML answers (not on
// this machine or CI); the History panel compares the run it follows (loss and grad norm). A console given a
// wrong token says so in --dump-state, asks once and stops; its script fails naming the refusal. No process
// may outlive the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/ui/console/xvfb_console.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace testing_support;

TEST(ConsoleDevices, DeviceSeriesAComparedRunAndAWrongTokenInTheWindow) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_devices");
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 1");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  const auto workers_of = [&] { return children_of(daemons); };

  // A run, so the History panel has something to compare (it shows the newest run before any click).
  HttpClient api({.url = url, .token = up.token});
  Result<json> sub = api.post_json(
      "/v1/runs",
      {{"config", slurp(GANTRY_CONSOLE_TINY_CONFIG)}, {"layout", {{"dp", 2}}}, {"name", "compared"}});
  ASSERT_TRUE(sub.ok()) << sub.error();

  std::ofstream(dir / "script")
      << "wait_connected\nwait_devices 2\nwait_steps 3\nwait_compared 1\nwait_frames 3\n";
  const int code = run_gantry_script(dir, url, cluster / "token", 5);
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const std::vector<pid_t> workers = workers_of();

  const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains("Devices"));
  const json& d = state["devices"];
  EXPECT_EQ(d["metric"], "node_cpu");
  EXPECT_EQ(d["shown_metric"], "node_cpu");
  EXPECT_THAT(d["rows"].get<std::vector<std::string>>(), ::testing::ElementsAre("node-0", "node-1"));
  EXPECT_EQ(d["gpu_rows"], 0) << "node CPU is a node's series";
  EXPECT_GT(d["band_points"].get<size_t>(), 0u);
  for (const char* node : {"node-0", "node-1"}) {
    ASSERT_TRUE(d["newest"][node].is_number()) << d.dump();
    EXPECT_GE(d["newest"][node].get<double>(), 0);
    EXPECT_LE(d["newest"][node].get<double>(), 1);
  }
  // Drawn: the band's three series and the heatmap, with points.
  std::map<std::string, size_t> drawn;
  for (const json& s : state["series"]) drawn[s["name"].get<std::string>()] = s["length"].get<size_t>();
  for (const char* name : {"devices max", "devices mean", "devices min", "devices heatmap"})
    EXPECT_GT(drawn[name], 0u) << name;

  // The compared run's series: both metrics' curves hold points, and both plots drew them.
  const json& h = state["history"];
  ASSERT_GE(h["overlay"].size(), 1u) << h.dump();
  EXPECT_EQ(h["overlay"][0]["name"].get<std::string>().find("compared") != std::string::npos, true)
      << h.dump();
  EXPECT_GT(h["overlay"][0]["length"].get<size_t>(), 0u);
  ASSERT_GE(h["overlay2"].size(), 1u);
  EXPECT_GT(h["overlay2"][0]["length"].get<size_t>(), 0u);
  EXPECT_EQ(h["metrics"], json({"loss", "grad_norm"}));
  size_t compare_series = 0;
  for (const auto& [name, length] : drawn) compare_series += name.rfind("compare ", 0) == 0 && length > 0;
  EXPECT_GE(compare_series, 2u) << "a compared run's loss and grad norm";

  // The same coordinator with a wrong token: the console says so, stops asking, and a script fails naming it.
  const fs::path wrong = dir / "wrong_token";
  std::ofstream(wrong) << "gantry-not-the-token-0000000000000000\n";
  fs::permissions(wrong, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  const std::string console = xvfb_run(dir / "Xauthority") + std::string(GANTRY_BIN) +
                              " --width 1000 --height 700 --connect " + url + " --token-file " +
                              wrong.string() + " --state-dir " + (dir / "state2").string();
  // The refusal, then many frames: one refusal. (The frames counted from the start could all be drawn
  // before a loaded machine's coordinator answered.)
  std::ofstream(dir / "refused") << "wait_refused\nwait_frames 300\n";
  EXPECT_EQ(
      run_shell(console + " --frames 1 --dump-state " + (dir / "wrong.json").string() + " --script " +
                (dir / "refused").string() + " </dev/null >/dev/null 2>" + (dir / "wrong.err").string()),
      0)
      << slurp(dir / "wrong.err");
  const json refused = json::parse(slurp(dir / "wrong.json"), nullptr, false);
  ASSERT_FALSE(refused.is_discarded()) << slurp(dir / "wrong.json");
  EXPECT_EQ(refused["phase"], "unauthorized");
  EXPECT_EQ(refused["connected"], false);
  EXPECT_EQ(refused["auth_refusals"], 1) << "the console asked again with a token already refused";
  EXPECT_THAT(refused["error"].get<std::string>(), ::testing::HasSubstr("refused the token (401"));
  EXPECT_THAT(refused["error"].get<std::string>(), ::testing::HasSubstr("not retrying"));
  // With a script: wait_connected fails at once, exit code 1, the reason on stderr.
  std::ofstream(dir / "script2") << "wait_connected\n";
  EXPECT_EQ(run_shell(console + " --script " + (dir / "script2").string() + " </dev/null >/dev/null 2>" +
                      (dir / "wrong2.err").string()),
            1)
      << slurp(dir / "wrong2.err");
  EXPECT_THAT(slurp(dir / "wrong2.err"), ::testing::HasSubstr("refused the token"));

  down_and_expect_gone(cluster, daemons, workers);
}

}  // namespace
}  // namespace gantry::console
