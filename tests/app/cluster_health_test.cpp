// The agents' health checks against a real `up` cluster (2 nodes x 2 slots and a spare): node-1's free-disk
// threshold is raised at run time above what its disk really has (its agent re-reads
// <agent dir>/min_free_disk_gb each check; statvfs of the real folder decides), so its agent reports it
// unhealthy; the coordinator records node_unhealthy with the reason, moves the run onto the spare by itself
// through the quarantine's path, places nothing new on node-1, shows the health in /v1/cluster and
// `ctl status`; when the threshold is lowered again node-1 is usable again with a node_healthy event.
#include <fstream>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

class ClusterHealth : public ClusterCli {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 2 --spares 1"; }
  size_t daemons() const override { return 4; }

  json node(const std::string& id) {
    const json cluster = get("/v1/cluster");
    for (const json& n : cluster["nodes"])
      if (n["id"] == id) return n;
    return json::object();
  }
};

TEST_F(ClusterHealth, AFullDiskMarksTheNodeUnhealthyAndTheRunMovesToTheSpareByItself) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 30s)) << run_state(id).dump();
  workers_ = children_of(pids_);

  // Healthy with the default threshold (1 GiB): the disk check ran and passed.
  ASSERT_TRUE(eventually([&] { return node("node-1")["health"].value("state", "") == "ok"; }, 10s))
      << node("node-1").dump();
  bool disk_ok = false;
  const json before = node("node-1");
  for (const json& c : before["health"]["checks"])
    disk_ok = disk_ok || (c["name"] == "disk" && c["state"] == "ok");
  EXPECT_TRUE(disk_ok) << node("node-1").dump();

  // A threshold no disk meets (a billion GiB): the real free space of node-1's folder is below it.
  const fs::path threshold = dir_ / "agents" / "node-1" / "min_free_disk_gb";
  std::ofstream(threshold) << "1000000000\n";
  ASSERT_TRUE(eventually([&] { return node("node-1")["state"] == "unhealthy"; }, 10s))
      << node("node-1").dump();
  const std::string reason = node("node-1")["health"].value("reason", "");
  EXPECT_THAT(reason, HasSubstr("disk: " + (dir_ / "agents" / "node-1").string() + " has "));
  EXPECT_THAT(reason, HasSubstr("below the threshold of 1000000000.00 GiB"));

  // The run leaves node-1 for the spare at the same dp, without anyone asking.
  ASSERT_TRUE(eventually(
      [&] {
        const json r = run_state(id);
        return r["generation"] == 2 && r["state"] == "running";
      },
      40s))
      << run_state(id).dump();
  const int64_t placed_at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > placed_at + 1; }, 30s)) << run_state(id).dump();
  for (pid_t w : children_of(pids_)) workers_.push_back(w);
  const json moved = run_state(id);
  EXPECT_EQ(moved["layout"]["dp"], 4);
  std::map<std::string, int> ranks_on;
  for (const json& share : moved["placement"])
    ranks_on[share["node"].get<std::string>()] = share["ranks"].get<int>();
  EXPECT_EQ(ranks_on, (std::map<std::string, int>{{"node-0", 2}, {"spare-0", 2}})) << moved.dump();

  const std::vector<json> unhealthy = events(id, "node_unhealthy");
  ASSERT_EQ(unhealthy.size(), 1u);
  EXPECT_EQ(unhealthy[0]["node"], "node-1");
  EXPECT_THAT(unhealthy[0]["message"].get<std::string>(), HasSubstr("below the threshold"));
  const std::vector<json> requested = events(id, "quarantine_requested");
  ASSERT_EQ(requested.size(), 1u);
  EXPECT_THAT(requested[0]["message"].get<std::string>(), HasSubstr("node node-1 unhealthy (disk: "));
  ASSERT_EQ(events(id, "quarantine_placed").size(), 1u);
  EXPECT_THAT(events(id, "quarantine_stopped")[0]["message"].get<std::string>(),
              HasSubstr("to leave unhealthy node node-1"));

  // Nothing new goes to node-1 while it is unhealthy (its two slots are the only free ones).
  Result<HttpReply> refused = api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(refused.ok()) << refused.error();
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("node-1 (unhealthy"));

  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome status = run_engine(ctl + "status");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("HEALTH"));
  EXPECT_THAT(status.out, HasSubstr("unhealthy: disk: "));

  // The threshold back below the free space: node-1 is usable again, and the run's history says so.
  std::ofstream(threshold) << "0.001\n";
  ASSERT_TRUE(eventually([&] { return node("node-1")["state"] == "healthy"; }, 10s)) << node("node-1").dump();
  EXPECT_EQ(node("node-1")["health"]["state"], "ok");
  ASSERT_TRUE(eventually([&] { return events(id, "node_healthy").size() == 1; }, 5s));
  Result<json> second =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(second.ok()) << second.error();
  EXPECT_EQ(second->at("placement")[0]["node"], "node-1");
  ASSERT_TRUE(eventually([&] { return last_step(second->at("id").get<int64_t>()) >= 1; }, 30s));
  for (pid_t w : children_of(pids_)) workers_.push_back(w);
}

TEST_F(ClusterHealth, ABadThresholdFileIsIgnoredAndSaid) {
  const fs::path threshold = dir_ / "agents" / "node-0" / "min_free_disk_gb";
  std::ofstream(threshold) << "lots\n";
  ASSERT_TRUE(eventually(
      [&] {
        return slurp((dir_ / "agent-node-0.log").string()).find("is not a number of GiB") !=
               std::string::npos;
      },
      10s))
      << slurp((dir_ / "agent-node-0.log").string());
  EXPECT_EQ(node("node-0")["state"], "healthy");
}

}  // namespace
}  // namespace gantry
