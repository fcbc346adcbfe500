// Quarantine and Release in the real window (issue 21): `gantry` under Xvfb against a real `up` cluster.
// With no rank flagged (the run's straggler scoring off, so no flag can come by chance on a loaded machine)
// the Stragglers panel's Quarantine is disabled and says why; a node quarantined through the API shows a
// Release button in the Cluster panel, and clicking it brings the node back at the coordinator.
//
// Made robust against what hung an earlier attempt: the script waits on nothing that may already have
// happened (no wait_event: the quarantine happens before the console starts, and the release's outcome is
// wait_action's, which counts only outcomes after the click) and opens no modal dialog (the Release button
// acts at once; Quarantine's confirmation is never opened). No timing bounds: each wait is on a condition.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/ui/console/xvfb_console.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace testing_support;

TEST(ConsoleQuarantine, QuarantineIsDisabledWithNothingFlaggedAndReleaseBringsANodeBack) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_quarantine");
  const UpCluster up = up_cluster(dir, "--nodes 3 --slots 1");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  HttpClient api({.url = url, .token = up.token});
  Result<json> sub = api.post_json("/v1/runs", {{"config", slurp(GANTRY_CONSOLE_TINY_CONFIG)},
                                                {"layout", {{"dp", 2}}},
                                                {"name", "quarantine-test"},
                                                {"straggler", {{"enabled", false}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t run = sub->at("id").get<int64_t>();
  // The node the run is not on: fencing it moves nothing, and two healthy nodes stay.
  std::set<std::string> used;
  ASSERT_TRUE(eventually(
      [&] {
        Result<json> r = api.get_json("/v1/runs/" + std::to_string(run));
        used.clear();
        if (r.ok())
          for (const json& s : r->value("placement", json::array())) used.insert(s.value("node", ""));
        return !used.empty();
      },
      60s));
  std::string idle;
  for (const char* n : {"node-0", "node-1", "node-2"})
    if (!used.count(n)) idle = n;
  ASSERT_FALSE(idle.empty());
  Result<json> q = api.post_json("/v1/nodes/" + idle + "/quarantine", json::object());
  ASSERT_TRUE(q.ok()) << q.error();
  const auto state_of = [&](const std::string& node) {
    Result<json> c = api.get_json("/v1/cluster");
    if (c.ok())
      for (const json& n : c->value("nodes", json::array()))
        if (n.value("id", "") == node) return n.value("state", std::string());
    return std::string();
  };
  ASSERT_EQ(state_of(idle), "quarantined");

  std::ofstream(dir / "script") << "wait_connected\nwait_steps 3\nclick \"Release " << idle
                                << "\"\nwait_action\nwait_frames 3\n";
  const int code = run_gantry_script(dir, url, cluster / "token", 5);
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const std::vector<pid_t> workers = children_of(daemons);

  const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  // Nothing flagged: Quarantine is disabled, and says why.
  EXPECT_EQ(state["quarantine"]["enabled"], false) << state["quarantine"].dump();
  EXPECT_THAT(state["quarantine"]["why_not"].get<std::string>(),
              ::testing::HasSubstr("is flagged as a straggler (tick Override"));
  // Release: the coordinator accepted it (wait_action), and the node takes work again.
  EXPECT_EQ(state["last_action"]["ok"], true) << state["last_action"].dump();
  EXPECT_EQ(state_of(idle), "healthy");

  down_and_expect_gone(cluster, daemons, workers);
}

}  // namespace
}  // namespace gantry::console
