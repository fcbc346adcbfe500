// A 3D run in the real window (issue 17): `gantry` under Xvfb against a real cluster running tp 2 x dp 2,
// whose rank 3 has a slowed forward (GANTRY_TEST_WORKER_FAULT). Through --script and --dump-state: the
// console received each rank's (dp, pp, tp) coordinate as the coordinator placed it (tp innermost), the
// header's layout is the run's, and the tp group of the slow rank (dp 1) is the one marked slowest. No
// process may outlive the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/ui/console/xvfb_console.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace testing_support;

TEST(ConsoleLayout, EachRanksCoordinateAndTheSlowTpGroupShow) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_layout");
  // Every worker of this cluster reads the fault: rank 3's forward (tp group dp 1) takes 300 ms longer.
  ::setenv("GANTRY_TEST_WORKER_FAULT", "3:slow_forward:300", 1);
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 2");
  ::unsetenv("GANTRY_TEST_WORKER_FAULT");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  HttpClient api({.url = url, .token = up.token});
  Result<json> sub = api.post_json("/v1/runs", {{"config", slurp(GANTRY_CONSOLE_TINY_CONFIG)},
                                                {"layout", {{"dp", 2}, {"tp", 2}}},
                                                {"name", "layout-test"}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t run = sub->at("id").get<int64_t>();

  std::ofstream(dir / "script") << "wait_connected\nwait_steps 6\nwait_frames 3\n";
  const int code = run_gantry_script(dir, url, cluster / "token", 5);
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const std::vector<pid_t> workers = children_of(daemons);

  const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains("Cluster"));
  EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains("Run"));
  EXPECT_EQ(state["run"]["id"], run);
  const json& l = state["layout"];
  EXPECT_EQ(l["dp"], 2);
  EXPECT_EQ(l["tp"], 2);
  EXPECT_EQ(l["pp"], 1);
  ASSERT_EQ(l["ranks"].size(), 4u) << l.dump();
  for (const json& r : l["ranks"]) {
    const int rank = r["rank"].get<int>();
    EXPECT_EQ(r["coord"], json::array({rank / 2, 0, rank % 2})) << r.dump();
  }
  EXPECT_EQ(l["ranks"][0]["node"], l["ranks"][1]["node"]) << "a tp group straddles nodes";
  EXPECT_TRUE(l["stages"].empty()) << "pp 1 has no stages to compare";
  ASSERT_EQ(l["tp_groups"].size(), 2u) << l.dump();
  EXPECT_EQ(l["tp_groups"][0]["ranks"], json::array({0, 1}));
  EXPECT_EQ(l["tp_groups"][1]["name"], "tp group dp 1 pp 0");
  EXPECT_TRUE(l["tp_groups"][1]["slowest"].get<bool>()) << l.dump();
  EXPECT_FALSE(l["tp_groups"][0]["slowest"].get<bool>()) << l.dump();

  down_and_expect_gone(cluster, daemons, workers);
}

}  // namespace
}  // namespace gantry::console
